"""`python -m common.bench`: the harness (harness.py)."""
from common.bench.harness import main

raise SystemExit(main())
