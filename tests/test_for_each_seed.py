"""CPU tier: common.testing's property-test helpers. for_each_seed runs a check over every seed in one test and
fails naming the smallest seed that fails, with that seed's error; seed_ranges puts the whole range under the
slow marker, and a stage's byte-identical copy of a property test a few seeds (earliest_copy says which stage's
code it is); cases runs a test's sizes in one test case and fails naming the first failing case; remember_logits
answers a reference model's repeated questions from a memo."""
import inspect
from types import SimpleNamespace

import numpy as np
import pytest

from common.testing import cases, earliest_copy, for_each_seed, remember_logits, seed_ranges


def test_every_seed_is_checked_smallest_first_and_its_results_come_back_in_that_order():
    seen = []

    def check(seed):
        seen.append(seed)
        return seed * seed

    assert for_each_seed([3, 0, 2, 1], check) == [0, 1, 4, 9]
    assert seen == [0, 1, 2, 3]


def test_a_failure_names_the_smallest_failing_seed_and_its_assertion():
    seen = []

    def check(seed):
        seen.append(seed)
        assert seed % 7 != 5, f"seed {seed} is 5 mod 7"

    with pytest.raises(AssertionError) as info:
        for_each_seed(range(30), check)
    message = str(info.value)
    assert message.startswith("seed 5 fails, the smallest of 4 failing seeds of 30 (then 12, 19, 26): "
                              "AssertionError: seed 5 is 5 mod 7")
    assert isinstance(info.value.__cause__, AssertionError)      # its traceback is shown with the report
    assert seen == list(range(30))                                # one failure does not hide the others' count


def test_any_error_and_a_failed_pytest_raises_count_as_failures():
    def check(seed):
        if seed == 2:
            with pytest.raises(ValueError):                       # DID NOT RAISE: pytest's own Failed
                pass
        if seed == 1:
            raise KeyError("no such block")

    with pytest.raises(AssertionError, match=r"^seed 1 fails, the smallest of 2 failing seeds of 4 \(then 2\): "
                                             r"KeyError: 'no such block'"):
        for_each_seed(range(4), check)


def test_seed_ranges_runs_a_few_seeds_by_default_and_all_of_them_when_slow():
    mark = seed_ranges(300, 3000).mark
    default, full = mark.args[1]
    assert mark.args[0] == "seeds" and (default.id, full.id) == ("first-300-seeds", "all-3000-seeds")
    assert default.values == (range(300),) and full.values == (range(3000),)
    assert not default.marks and [m.name for m in full.marks] == ["slow"]


def stages(tmp_path, *edits):
    """Four stages whose tests/test_x.py imports mod.py, which imports dep.py inside a function; edits: (stage
    number, file, text) applied on top."""
    files = {"tests/test_x.py": "from ..mod import f\n", "tests/__init__.py": "", "__init__.py": "",
             "mod.py": "def f():\n    from .dep import g\n    return g()\n", "dep.py": "def g():\n    return 1\n",
             "other.py": "X = 1\n"}
    for n, name in enumerate(["stage01_a", "stage02_b", "stage03_c", "stage04_d"], 1):
        for rel, text in files.items():
            (tmp_path / name / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / name / rel).write_text(text)
        for stage, rel, text in edits:
            if stage == n and text is None:
                (tmp_path / name / rel).unlink()
            elif stage == n:
                (tmp_path / name / rel).write_text(text)
    return lambda name: str(tmp_path / name / "tests" / "test_x.py")


def test_a_copy_is_traced_back_through_every_module_its_test_imports(tmp_path):
    test = stages(tmp_path, (2, "other.py", "X = 2\n"))          # a module the test does not import: no matter
    assert [earliest_copy(test(s)) for s in ("stage01_a", "stage02_b", "stage04_d")] == \
        [None, "stage01_a", "stage01_a"]
    two = "def g():\n    return 2\n"
    test = stages(tmp_path, (3, "dep.py", two), (4, "dep.py", two))      # imported inside mod's function
    assert [earliest_copy(test(s)) for s in ("stage02_b", "stage03_c", "stage04_d")] == \
        ["stage01_a", None, "stage03_c"]
    test = stages(tmp_path, (2, "tests/test_x.py", "from ..mod import f  # edited\n"))   # the test itself
    assert [earliest_copy(test(s)) for s in ("stage02_b", "stage03_c", "stage04_d")] == [None, None, "stage03_c"]
    test = stages(tmp_path, (1, "dep.py", None))                  # an earlier stage without the module
    assert earliest_copy(test("stage02_b")) is None and earliest_copy(test("stage03_c")) == "stage02_b"
    assert earliest_copy(__file__) is None                        # not a stage's test


def test_a_copy_takes_a_few_seeds_by_default_and_every_seed_under_slow(tmp_path):
    test = stages(tmp_path)
    default, full = seed_ranges(300, 3000, copy_seeds=20, test_file=test("stage03_c")).mark.args[1]
    assert (default.id, default.values, default.marks) == ("first-20-seeds-as-stage01_a", (range(20),), ())
    assert full.values == (range(3000),) and [m.name for m in full.marks] == ["slow"]
    default, _ = seed_ranges(300, 3000, copy_seeds=20, test_file=test("stage01_a")).mark.args[1]
    assert (default.id, default.values) == ("first-300-seeds", (range(300),))


def fake_reference(asked, weight):
    def last_logits(token_ids):
        asked.append((weight, list(token_ids)))
        return np.array([sum(token_ids), len(token_ids) * weight], np.float32)

    model = SimpleNamespace(config="tiny", w={"w": np.full(3, weight, np.float32)}, last_logits=last_logits)
    return SimpleNamespace(model=model)


def test_remembered_logits_are_the_model_s_for_each_sequence_computed_once_while_remembered():
    asked = []
    ref = fake_reference(asked, 1.5)
    assert remember_logits(ref, size=2) is ref
    got = [ref.model.last_logits(t).tolist() for t in ([1, 2], np.array([1, 2]), [1, 2, 3], [1, 2], [4], [1, 2, 3])]
    assert got == [[3, 3], [3, 3], [6, 4.5], [3, 3], [4, 1.5], [6, 4.5]]
    assert asked == [(1.5, t) for t in ([1, 2], [1, 2, 3], [4], [1, 2, 3])]   # [1, 2, 3]: least recently asked
    ref.model.last_logits([4])[0] = 99                        # a copy: the memo keeps the model's answer
    assert ref.model.last_logits([4]).tolist() == [4, 1.5]


def test_a_model_of_the_same_weights_shares_the_memo_and_one_of_other_weights_does_not():
    asked = []
    first, same, other = (remember_logits(fake_reference(asked, w)) for w in (2.5, 2.5, 3.5))
    assert first.model.last_logits([7]).tolist() == [7, 2.5]
    assert same.model.last_logits([7]).tolist() == [7, 2.5] and other.model.last_logits([7]).tolist() == [7, 3.5]
    assert asked == [(2.5, [7]), (3.5, [7])]


def test_cases_run_every_combination_in_one_call_the_top_decorator_outermost():
    seen = []

    @cases("a", [1, pytest.param(2, id="two")])
    @cases("b, c", [(3, 4), (5, 6)])
    def check(fixture, a, b, c):
        seen.append((fixture, a, b, c))

    assert list(inspect.signature(check).parameters) == ["fixture"]      # what pytest asks fixtures for
    assert check.__name__ == "check" and check("f") is None
    assert seen == [("f", 1, 3, 4), ("f", 1, 5, 6), ("f", 2, 3, 4), ("f", 2, 5, 6)]


def test_a_failing_case_is_named_by_its_parameters_and_the_others_still_run():
    seen = []

    @cases("n", [1, 2, 3, 4, 5])
    @cases("hd", [64, 128])
    def check(n, hd):
        seen.append((n, hd))
        if hd == 128 and n % 2:
            raise ValueError(f"no kernel for {n}")
        assert n != 4, "four"

    with pytest.raises(AssertionError) as info:
        check()
    assert str(info.value) == ("n=1, hd=128 fails, the first of 5 failing cases of 10 (then n=3, hd=128; "
                               "n=4, hd=64; n=4, hd=128; ...): ValueError: no kernel for 1")
    assert isinstance(info.value.__cause__, ValueError)                    # its traceback is shown with the report
    assert len(seen) == 10


def test_cases_skip_only_where_every_case_skips():
    @cases("n", [1, 2])
    def some(n):
        if n == 1:
            pytest.skip("not on this GPU")
        assert n == 2

    @cases("n", [1, 2])
    def every(n):
        pytest.skip("not on this GPU")

    some()
    with pytest.raises(pytest.skip.Exception, match="all 2 cases: not on this GPU"):
        every()


def test_cases_refuse_what_they_cannot_loop_over():
    with pytest.raises(TypeError, match="marks"):
        cases("n", [pytest.param(1, marks=pytest.mark.slow)])
    with pytest.raises(TypeError, match="not 2 values"):
        cases("n, m", [(1, 2), (3,)])
    with pytest.raises(TypeError, match="parameters"):
        cases("m", [1])(lambda n: None)


@pytest.mark.parametrize("kind", ["row", "tiles"])
@cases("n, m", [(1, 2), (3, 4)])
def test_cases_sit_under_pytest_s_own_parametrisation(request, kind, n, m):
    assert request.node.callspec.params == {"kind": kind}                 # n and m are not pytest's
    assert (n, m) in ((1, 2), (3, 4))
