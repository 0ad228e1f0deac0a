"""`python -m common.readme` runs common/course/readme.py, by the name the chapters and scripts use."""
import runpy

if __name__ == "__main__":
    runpy.run_module("common.course.readme", run_name="__main__", alter_sys=True)
