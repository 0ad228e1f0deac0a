"""`python -m common.profile` runs common/bench/profile.py, by the name the chapters and scripts use."""
import runpy

if __name__ == "__main__":
    runpy.run_module("common.bench.profile", run_name="__main__", alter_sys=True)
