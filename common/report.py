"""`python -m common.report` runs common/course/report.py, by the name the chapters and scripts use."""
import runpy

if __name__ == "__main__":
    runpy.run_module("common.course.report", run_name="__main__", alter_sys=True)
