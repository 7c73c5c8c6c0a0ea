"""Searches over a constraint model, each at a budget of measured trials: CGA (Heron's constraint-based genetic
algorithm) and the baselines the issue compares it with in the same harness: constrained random (RandSAT
samples), a penalty GA (genes are knob values; invalid children are penalized, not repaired) and FlexTensor's
simulated annealing with its Q-learning choice of step.

A Problem holds the model, a `measure` (a solution -> seconds, None when it failed), and the cost model's
features. Every search returns a Run: its measurements in order, so the best-so-far at any trial count can be read
off, and its counts of solver calls and invalid candidates.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .constraints import Csp, In, satisfied
from .cost_model import CostModel
from .cpsat import Infeasible, complete, randsat


@dataclass
class Problem:
    csp: Csp
    measure: Callable[[dict], float | None]
    features: Callable[[dict], list[float]]
    feature_deps: list[tuple[str, ...]]

    def key(self, a: dict) -> tuple:
        return tuple(a[k] for k in self.csp.knobs)


@dataclass
class Run:
    name: str
    measured: list = field(default_factory=list)  # (knob tuple, seconds or None), in order
    solves: int = 0
    invalid: int = 0  # candidates that broke the model (0 for CGA: its children are solutions)
    children: int = 0
    times: dict = field(default_factory=lambda: {"solve": 0.0, "measure": 0.0, "train": 0.0})

    def best(self, trials: int | None = None) -> float:
        vals = [s for _, s in self.measured[:trials] if s is not None]
        return min(vals) if vals else math.inf

    def best_key(self) -> tuple | None:
        vals = [(s, k) for k, s in self.measured if s is not None]
        return min(vals)[1] if vals else None


class _Trials:
    """Measurements with the budget and dedup the searches share."""

    def __init__(self, problem: Problem, run: Run, budget: int):
        self.p, self.run, self.budget = problem, run, budget
        self.seen: dict[tuple, tuple[dict, float | None]] = {}

    @property
    def left(self) -> int:
        return self.budget - len(self.run.measured)

    def measure(self, a: dict) -> float | None:
        k = self.p.key(a)
        if k in self.seen:
            return self.seen[k][1]
        t0 = time.perf_counter()
        s = self.p.measure(a)
        self.run.times["measure"] += time.perf_counter() - t0
        self.seen[k] = (a, s)
        self.run.measured.append((k, s))
        return s

    def valid(self) -> list[tuple[dict, float]]:
        return [(a, s) for a, s in self.seen.values() if s is not None]


def _solve(run: Run, csp: Csp, rng: random.Random, extra=None) -> dict:
    t0 = time.perf_counter()
    try:
        return randsat(csp, rng, extra)
    finally:
        run.solves += 1
        run.times["solve"] += time.perf_counter() - t0


def constrained_random(problem: Problem, trials: int, seed: int = 0) -> Run:
    """RandSAT samples, measured until the budget is spent."""
    rng = random.Random(seed)
    run = Run("random")
    t = _Trials(problem, run, trials)
    misses = 0
    while t.left > 0 and misses < 50 * trials:
        a = _solve(run, problem.csp, rng)
        if problem.key(a) in t.seen:
            misses += 1
            continue
        t.measure(a)
    return run


def _roulette(rng: random.Random, items: list, fitness: np.ndarray, n: int) -> list:
    w = np.asarray(fitness, np.float64)
    w = w - w.min() + 1e-9
    w = w / w.sum()
    idx = rng.choices(range(len(items)), weights=w.tolist(), k=n)
    return [items[i] for i in idx]


def cga(problem: Problem, trials: int, seed: int = 0, pop: int = 200, gens: int = 5, select: int = 32,
        topk: int = 32, batch: int = 32, eps: float = 0.6, key_ratio: float = 0.14, random_keys: bool = False,
        check_children: bool = True) -> Run:
    """Heron's CGA (its code's defaults). Each round: the best measured points and `pop` RandSAT samples, ranked by
    the cost model; `gens` generations of children (crossover: IN(v, {parent1[v], parent2[v]}) on the key
    variables; mutation: one of those constraints dropped; each child one RandSAT solve, so every child is a
    solution); then `batch` new points measured, the top `eps` of them by prediction and the rest by roulette, and
    the model retrained. `random_keys`: the key variables at random (Heron's CGA-1 ablation)."""
    rng = random.Random(seed)
    csp = problem.csp
    run = Run("cga" if not random_keys else "cga-1")
    t = _Trials(problem, run, trials)
    model = CostModel(problem.feature_deps, seed=seed)
    n_keys = max(2, math.ceil(key_ratio * len(csp.vars)))
    while t.left > 0:
        measured = sorted(t.valid(), key=lambda x: x[1])[:topk]
        P = [a for a, _ in measured] + [_solve(run, csp, rng) for _ in range(pop)]
        allp = list(P)
        if model.trained:
            P = [P[i] for i in np.argsort(-model.predict([problem.features(a) for a in P]))[:pop]]
            imp = model.importance()
            ranked = [v for v in csp.knobs if imp.get(v, 0.0) > 0]
            ranked.sort(key=lambda v: -imp[v])
            rest = [v for v in csp.knobs if v not in ranked]
            rng.shuffle(rest)
            keys = (ranked + rest)[:n_keys]
            if random_keys:
                keys = rng.sample(list(csp.knobs), min(n_keys, len(csp.knobs)))
            for _ in range(gens):
                fit = model.predict([problem.features(a) for a in P])
                parents = _roulette(rng, P, fit, select)
                kids = []
                for _ in range(pop):
                    c1, c2 = rng.choice(parents), rng.choice(parents)
                    extra = [In(v, tuple(sorted({c1[v], c2[v]}))) for v in keys]
                    extra.pop(rng.randrange(len(extra)))  # mutation
                    try:
                        kid = _solve(run, csp, rng, extra)
                    except Infeasible:  # cannot happen: parent 1 satisfies every extra constraint
                        run.invalid += 1
                        continue
                    run.children += 1
                    if check_children and satisfied(csp, kid, extra):
                        run.invalid += 1
                        continue
                    kids.append(kid)
                allp += kids
                fit_all = model.predict([problem.features(a) for a in allp])
                elite = [allp[i] for i in np.argsort(-fit_all)[:20]]
                P = kids + elite
        # new points only, once each
        fresh, keys_seen = [], set(t.seen)
        for a in allp:
            k = problem.key(a)
            if k not in keys_seen:
                keys_seen.add(k)
                fresh.append(a)
        if not fresh:
            continue
        n = min(batch, t.left, len(fresh))
        if model.trained:
            pred = model.predict([problem.features(a) for a in fresh])
            order = list(np.argsort(-pred))
            greedy = [fresh[i] for i in order[:int(eps * n)]]
            rest_idx = order[int(eps * n):]
            rest = [fresh[i] for i in rest_idx]
            picks = []
            if rest:
                want = n - len(greedy)
                for a in _roulette(rng, rest, pred[rest_idx], 4 * want):
                    if len(picks) >= want:
                        break
                    if all(a is not b for b in picks):
                        picks.append(a)
            chosen = greedy + picks
        else:
            chosen = rng.sample(fresh, n)
        for a in chosen:
            if t.left <= 0:
                break
            t.measure(a)
        data = t.valid()
        if len(data) >= 4:
            t0 = time.perf_counter()
            model.fit([problem.features(a) for a, _ in data], [s for _, s in data])
            run.times["train"] += time.perf_counter() - t0
    return run


def penalty_ga(problem: Problem, trials: int, seed: int = 0, pop: int = 50, mutation: float = 0.2) -> Run:
    """A plain GA over the knobs' values (uniform crossover, random-reset mutation, tournament selection): children
    outside the model are penalized and dropped (counted in `invalid`), not repaired; valid new ones are measured."""
    rng = random.Random(seed)
    csp = problem.csp
    run = Run("penalty-ga")
    t = _Trials(problem, run, trials)

    def random_value(k):
        v = csp.vars[k]
        cands = next((c.values for c in csp.constraints if isinstance(c, In) and c.var == k), None)
        return rng.choice(cands) if cands else rng.randint(v.lo, v.hi)

    def fitness(a):
        s = t.seen.get(problem.key(a), (None, None))[1]
        return -s if s is not None else -math.inf

    P = [_solve(run, csp, rng) for _ in range(pop)]
    for a in P:
        if t.left > 0:
            t.measure(a)
    stall = 0
    while t.left > 0 and stall < 200:
        kids = []
        for _ in range(pop):
            p1 = max(rng.sample(P, 2), key=fitness)
            p2 = max(rng.sample(P, 2), key=fitness)
            genes = {k: (p1 if rng.random() < 0.5 else p2)[k] for k in csp.knobs}
            for k in csp.knobs:
                if rng.random() < mutation:
                    genes[k] = random_value(k)
            run.children += 1
            t0 = time.perf_counter()
            a = complete(csp, genes)
            run.times["solve"] += time.perf_counter() - t0
            if a is None:
                run.invalid += 1
                continue
            kids.append(a)
        before = len(run.measured)
        for a in kids:
            if t.left <= 0:
                break
            t.measure(a)
        stall = stall + 1 if len(run.measured) == before else 0
        P = sorted(P + kids, key=fitness, reverse=True)[:pop]
    return run


def annealing(problem: Problem, trials: int, seed: int = 0, temperature: float = 0.1, cooling: float = 0.97,
              alpha: float = 0.5, eps: float = 0.2) -> Run:
    """FlexTensor's search: simulated annealing whose step (a knob moved one candidate or one doubling up or down)
    is chosen by Q-learning (epsilon-greedy on each step's running reward, the relative gain it brought); a step
    outside the model is a failed move (counted in `invalid`)."""
    rng = random.Random(seed)
    csp = problem.csp
    run = Run("annealing")
    t = _Trials(problem, run, trials)
    cands = {k: next((sorted(c.values) for c in csp.constraints if isinstance(c, In) and c.var == k), None)
             for k in csp.knobs}
    actions = [(k, d) for k in csp.knobs for d in (-1, 1)]
    q = {a: 0.0 for a in actions}

    def step(a, k, d):
        x = a[k]
        c = cands[k]
        if c:
            i = c.index(x) + d if x in c else 0
            return c[i] if 0 <= i < len(c) else None
        v = csp.vars[k]
        y = (x * 2 if d > 0 else x // 2) if v.hi - v.lo > 16 else x + d
        return y if v.lo <= y <= v.hi and y != x else None

    cur = _solve(run, csp, rng)
    cur_s = t.measure(cur) or math.inf
    T = temperature
    fails = 0
    while t.left > 0 and fails < 2000:
        act = rng.choice(actions) if rng.random() < eps else max(actions, key=lambda a: (q[a], rng.random()))
        y = step(cur, *act)
        nxt = None
        if y is not None:
            genes = {k: cur[k] for k in csp.knobs}
            genes[act[0]] = y
            run.children += 1
            nxt = complete(csp, genes)
            if nxt is None:
                run.invalid += 1
        if nxt is None or problem.key(nxt) in t.seen:
            q[act] += alpha * (-0.05 - q[act])
            fails += 1
            if fails % 50 == 0:  # stuck: restart from a fresh sample
                cur = _solve(run, csp, rng)
                cur_s = t.measure(cur) or math.inf
            continue
        s = t.measure(nxt)
        gain = (cur_s - s) / cur_s if s is not None and math.isfinite(cur_s) else -1.0
        q[act] += alpha * (gain - q[act])
        if s is not None and (s < cur_s or rng.random() < math.exp(min(0.0, gain) / max(T, 1e-9))):
            cur, cur_s = nxt, s
        T *= cooling
    return run
