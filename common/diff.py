"""`python -m common.diff` runs common/course/diff.py, by the name the chapters and scripts use."""
import runpy

if __name__ == "__main__":
    runpy.run_module("common.course.diff", run_name="__main__", alter_sys=True)
