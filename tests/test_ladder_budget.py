"""The ladder at a KV budget (workloads.Ladder.budget: ragged at 4 GiB of KV cache, stage07's claim) and what the
harness says where nothing can run."""
import pytest

from common.bench.harness import ladder_stages, main
from common.bench.workloads import LADDERS
from common.device import has_gpu


def test_a_ladder_at_its_budget_starts_at_the_budgets_first_stage_and_takes_no_baselines():
    gib, length, first = LADDERS["ragged"].budget
    tags = ladder_stages("ragged", at_budget=True).split(",")
    assert tags[0] == f"{first:02d}" and all(t.isdigit() for t in tags)               # stages alone
    assert tags[-1] == ladder_stages("ragged").split(",")[-1]                         # up to the newest
    assert (gib, length) == (4.0, 4096)


def test_a_ladder_at_another_budget_is_refused_naming_the_one_it_has(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--ladder", "--workload", "ragged", "--kv-cache-gib", "8", "--max-model-len", "4096"])
    assert info.value.code == 2
    assert "ragged's ladder at a budget is --kv-cache-gib 4 --max-model-len 4096" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--ladder", "--workload", "batch", "--kv-cache-gib", "4"])
    assert "batch's ladder at a budget is none" in capsys.readouterr().err


@pytest.mark.skipif(has_gpu()[0], reason="on a GPU the ladder runs")
def test_a_gpu_ladder_on_a_cpu_runs_nothing_exits_2_and_says_what_runs_here(tmp_path, capsys):
    assert main(["--ladder", "--workload", "load", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "nothing ran here" in err and "--workload cpu --model tiny" in err
    assert not list(tmp_path.iterdir())                        # no result file of nothing
