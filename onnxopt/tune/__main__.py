"""`python -m onnxopt.tune SHAPE ...`: the register-tile search on seed shapes (see tile_search._main)."""

from .tile_search import _main

raise SystemExit(_main())
