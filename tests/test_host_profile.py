"""CPU: common/bench/host_profile.py runs a stage's own loop under cProfile with a runner that costs nothing, and
splits a step's time between the runner and the loop; a stage without the step API is one line and exit 2."""
import pytest

from common.bench import host_profile


@pytest.mark.parametrize("stage", ["05", "09"])                # a synchronous loop, an asynchronous one
def test_the_loop_alone_is_profiled_and_split(stage, capsys, tmp_path):
    out = tmp_path / "profile.txt"
    assert host_profile.main(["--stage", stage, "--batch", "16", "--steps", "3", "--free-runner", "--out",
                              str(out)]) == 0
    text = capsys.readouterr().out
    assert "16 sequences decoding, token ids, runner FreeRunner" in text
    split = next(line for line in text.splitlines() if line.strip().startswith("step wall"))
    wall, runner, loop = (float(part.split(" ms")[0].split()[-1]) for part in split.split(";"))
    assert 0 < loop <= wall and 0 <= runner < wall
    assert "schedule" in out.read_text() and "pack" in out.read_text()     # the loop's functions, by name


def test_a_stage_without_the_step_api_is_refused(capsys):
    with pytest.raises(SystemExit) as info:
        host_profile.main(["--stage", "03"])
    assert info.value.code == 2 and "no stage with the step API" in capsys.readouterr().err
