"""Heron's constrained schedule search (ASPLOS'23) over the kernels' schedules.

schedule.py  a kernel's schedule as primitives (split, fuse, knob, compute-at, cache, vectorize, tensorize, parallel)
rules.py     the rules (C1-C6) that derive its constraint model from the schedule, the machine model's capacities
             and the instruction's description
constraints.py  the model: variables and PROD / SUM / EQ / LE / IN / SELECT, with a solver-free evaluator
cpsat.py     the model on OR-Tools CP-SAT: RandSAT (Heron's random sampler) and full enumeration
search.py    CGA (crossover and mutation as constraints, every child one RandSAT solve) and the baselines
cost_model.py  the XGBoost model on features that carry across shapes
packed_matmul.py  the packed-B matmul's schedule, and its candidates built and timed through the C entry point
"""
