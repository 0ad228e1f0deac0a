"""`python -m common.bench_serving` runs common/bench/serving.py, by the name the chapters and scripts use."""
import runpy

if __name__ == "__main__":
    runpy.run_module("common.bench.serving", run_name="__main__", alter_sys=True)
