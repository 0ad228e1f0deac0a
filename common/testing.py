"""What the GPU tests of every stage compare with: one error measure for logits, and one rule for greedy tokens.

The measure is the design's: relative L2 over the whole logits tensor, ‖got − want‖ / ‖want‖, below 2e-2
(`rel_l2`).
A per-row bound is the same number asked of each row alone, and a row is a noisier sample of the same rounding:
on tiny one decode row of 128K logits reached 2.34e-2 while its tensor was at 1.19e-2, with every token equal.
So every stage asserts the whole-tensor figure and prints the worst row (`rel_l2_rows`).

The greedy rule. Two correct bf16 engines (or one engine at two batch shapes, whose GEMMs sum in another order)
give logits that differ by about that tolerance, so where two tokens are nearly level each may rank them its own
way. How near is near is measured, not guessed: no logit moved by more than max |got − want| between the two
engines, so a top-1 choice whose margin (top-1 minus top-2) exceeds twice that cannot flip (`flip_bound`). Such a
step is decided, and there the tokens must be equal. `check_greedy` asserts, for two greedy runs and each
engine's logits along the earlier run's tokens (teacher-forced):
  1. at every decided step, the later engine's top-1 is the earlier run's token;
  2. the runs are equal token for token up to their first divergence, which must be at an undecided step;
  3. there, each engine's own logits prefer its own token (to within the flip bound: the teacher-forced path may
     round unlike the generating one), so the runs part only because their logits differ.
The bound grows with the measured difference, so the rule is only as strict as that difference is small: the
caller asserts the logits tolerance (rel_l2 < 2e-2) first. tests/test_greedy_rule.py shows each rule failing.
Where the generating runs computed their rows in other batch shapes than the teacher-forced logits (a run whose
batch changes step by step), the caller measures how far the later engine's own logits move with the batch
shape and passes that as `noise`: the bound is then 2 max(max |got − want|, noise).

Property tests (CPU, every stage's scheduler and block manager) run one check over many seeds: `for_each_seed`
loops over them in one test and fails naming the smallest seed that fails, and `seed_ranges` gives such a test
a few hundred seeds in every run and the whole range under the `slow` marker. A stage's copy of a property test
whose code is byte-identical to the previous stage's (`earliest_copy`) takes a few seeds by default: the earliest
stage with that code runs the few hundred.

Kernel tests over many sizes (shapes, warps a column, block sizes) run them in one test: `cases` stands where
`pytest.mark.parametrize` would, with the same arguments, and loops over every case inside one test case, failing
once with each failing case named by its parameters. The engine tests that run the numpy reference model over the
same sequences again and again (the reference's run, the engine's rows, a preemption's recompute) ask it through
`remember_logits`.
"""
from __future__ import annotations

import numpy as np

NEAR_TIE = 0.05   # logit std: below it a top-1 choice is left to bf16 rounding (agreement with HF, which we
#                   cannot teacher-force along our tokens; see the 1B tests)


def rel_l2(got: np.ndarray, want: np.ndarray) -> float:
    """‖got − want‖ / ‖want‖ over the whole tensor: the design's measure (NaN never passes)."""
    assert not np.isnan(got).any(), "NaN in the logits"
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def rel_l2_rows(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """‖got_t − want_t‖ / ‖want_t‖ for every row t: for the printout (the worst row), not the assertion."""
    assert not np.isnan(got).any(), "NaN in the logits"
    return np.linalg.norm(got - want, axis=-1) / np.linalg.norm(want, axis=-1)


def top1_margin(logits: np.ndarray) -> np.ndarray:
    """(top-1 − top-2) / std of each row: how clearly the greedy choice is decided, in logit std."""
    top2 = np.sort(logits, axis=-1)[..., -2:]
    return (top2[..., 1] - top2[..., 0]) / logits.std(axis=-1)


def flip_bound(got_logits: np.ndarray, want_logits: np.ndarray, noise: float = 0.0) -> float:
    """The largest top-1 margin the measured difference between two engines' logits can overturn: 2 max |Δ|
    (the top token can fall by max |Δ| while the runner-up rises by as much), |Δ| at least `noise`."""
    return 2.0 * max(float(np.abs(got_logits - want_logits).max()), noise)


def decided_steps(got_logits: np.ndarray, want_logits: np.ndarray, noise: float = 0.0) -> np.ndarray:
    """(steps,) bool: where the earlier engine's top-1 margin exceeds the flip bound."""
    top2 = np.sort(want_logits, axis=-1)[..., -2:]
    return (top2[..., 1] - top2[..., 0]) > flip_bound(got_logits, want_logits, noise)


def check_greedy(got: list[int], want: list[int], got_logits: np.ndarray, want_logits: np.ndarray,
                 noise: float = 0.0) -> int | None:
    """Assert the greedy rule above; return the first step where `got` leaves `want` (None: equal throughout).
    got_logits and want_logits are (len(want), V): each engine's logits along `want`'s tokens; noise: how far the
    later engine's logits move with the batch shape, where the runs' shapes were not the teacher-forced ones."""
    assert len(got_logits) == len(want_logits) == len(want), "logits must be given along want's tokens"
    bound, decided = flip_bound(got_logits, want_logits, noise), decided_steps(got_logits, want_logits, noise)
    top1 = got_logits.argmax(-1)
    bad = [i for i in np.flatnonzero(decided) if top1[i] != want[i]]
    assert not bad, (f"step {bad[0]}: top-1 {top1[bad[0]]} differs from the earlier run's token {want[bad[0]]} "
                     f"at a decided step (flip bound {bound:.3g})")
    step = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
    if step is None:
        assert len(got) == len(want), f"{len(got)} tokens against {len(want)}"
        return None
    assert not decided[step], (f"the runs part at step {step}, where the earlier engine's margin "
                               f"{top1_margin(want_logits[step]):.3f} std exceeds what the logit error can flip")
    mine, theirs = got[step], want[step]
    for name, logits, own, other in (("got", got_logits[step], mine, theirs),
                                     ("want", want_logits[step], theirs, mine)):
        lead = logits[own] - logits[other]
        assert lead > -bound, (f"step {step}: {name}'s own logits put token {other} {-lead:.3g} above the token "
                               f"{own} it chose; the divergence is not explained by the logits")
    return step


def check_reference_greedy(engine, ref, got: list, want: list, label: str) -> None:
    """Each output of an engine (`got`) against the reference engine's output for the same prompt (`want`): the
    engine's logits along the reference's tokens (engine.logits) within the design's bound of the reference
    model's (`ref`, a ReferenceModel), and the greedy rule above; one agreement line printed per output."""
    for g, w in zip(got, want):
        full = w.prompt_token_ids + w.token_ids
        steps = slice(len(w.prompt_token_ids) - 1, len(full) - 1)
        ref_logits, our_logits = ref.forward(full)[steps], engine.logits(full)[steps]
        assert rel_l2(our_logits, ref_logits) < 2e-2
        step = check_greedy(g.token_ids, w.token_ids, our_logits, ref_logits)
        print(f"{label}: {agreement_line(our_logits, ref_logits, step, len(w.token_ids))}")


def agreement_line(got_logits: np.ndarray, want_logits: np.ndarray, step: int | None, n: int,
                   noise: float = 0.0) -> str:
    """The test's printout: equal tokens, decided steps, where the runs parted and how decided that was."""
    decided = decided_steps(got_logits, want_logits, noise)
    part = "" if step is None else f"; parted at step {step}, margin {top1_margin(want_logits[step]):.3f} std"
    bound = flip_bound(got_logits, want_logits, noise)
    return (f"equal for {n if step is None else step} of {n} tokens; {int(decided.sum())} of {len(decided)} steps "
            f"decided (flip bound {bound:.3g}, {bound / want_logits.std():.3f} std){part}; logits rel L2 "
            f"{rel_l2(got_logits, want_logits):.2e}, worst row {rel_l2_rows(got_logits, want_logits).max():.2e}")


def mixed_greedy_requests(n: int, seed: int = 0):
    """n requests of 2..200 prompt tokens (BOS first) and 1..39 greedy ignore_eos tokens each: the cross-stage
    agreement tests' workload, uneven both ways."""
    from common.sampling import SamplingParams

    rng = np.random.default_rng(seed)
    prompts = [[128000] + rng.integers(0, 128000, int(rng.integers(1, 200))).tolist() for _ in range(n)]
    params = [SamplingParams(max_tokens=int(rng.integers(1, 40)), temperature=0.0, ignore_eos=True)
              for _ in range(n)]
    return prompts, params


def for_each_seed(seeds, check) -> list:
    """check(seed) for every seed, smallest first; return its results in that order. Where any fails (an
    assertion, any other error, or pytest.raises/pytest.fail inside it), raise one AssertionError naming the
    smallest failing seed and its error (chained, so its traceback shows), and how many seeds failed: one test
    case over hundreds of seeds, and the seed to rerun first."""
    import pytest

    results, failures = [], []
    for seed in sorted(seeds):
        try:
            results.append(check(seed))
        except (Exception, pytest.fail.Exception) as e:
            failures.append((seed, e))
    if failures:
        seed, err = failures[0]
        others = ", ".join(str(s) for s, _ in failures[1:6]) + (", ..." if len(failures) > 6 else "")
        raise AssertionError(f"seed {seed} fails, the smallest of {len(failures)} failing seeds of "
                             f"{len(results) + len(failures)}{f' (then {others})' if others else ''}: "
                             f"{type(err).__name__}: {err}") from err
    return results


def seed_ranges(default: int, full: int, copy_seeds: int | None = None, test_file: str | None = None):
    """Parametrise a property test over `seeds`: range(default) in every run, range(full) under the `slow`
    marker (deselected unless asked for: python -m pytest -m slow).

    With copy_seeds and test_file (the test module's __file__): where the test is a stage's inherited copy, its
    file and every module of its stage it imports byte-identical to an earlier stage's (`earliest_copy`), the
    default run takes range(copy_seeds) instead. The same seeds over the same code give the same outcome, so the
    few hundred run once, in the earliest stage with that code; the copy's few seeds check that it runs against
    its own stage's package, and `-m slow` still takes the whole range in every stage."""
    import pytest

    first = earliest_copy(test_file) if copy_seeds is not None and test_file is not None else None
    few = (pytest.param(range(copy_seeds), id=f"first-{copy_seeds}-seeds-as-{first}") if first else
           pytest.param(range(default), id=f"first-{default}-seeds"))
    return pytest.mark.parametrize("seeds", [
        few, pytest.param(range(full), id=f"all-{full}-seeds", marks=pytest.mark.slow)])


def earliest_copy(test_file: str) -> str | None:
    """The earliest stage of which the stage test module `test_file` (stageNN_name/tests/test_x.py) is a copy:
    walking back stage by stage while the test's file and every module of the stage it imports, directly or
    through other modules of the stage (relative imports anywhere in them, inside functions too), are
    byte-identical to the previous stage's files of the same names. None where the previous stage's differ or
    it has none, or the file is not a stage's test (the same outcome: nothing to share)."""
    from pathlib import Path

    test = Path(test_file).resolve()
    stage, root = test.parents[1], test.parents[2]
    if not stage.name.startswith("stage") or test.parent.name != "tests":
        return None
    files = _stage_closure(stage, test.relative_to(stage).as_posix())
    stages = sorted(p.name for p in root.glob("stage*") if p.is_dir())
    first = None
    for prev in reversed(stages[:stages.index(stage.name)]):
        here = stage if first is None else root / first
        if not all((root / prev / f).is_file() and (root / prev / f).read_bytes() == (here / f).read_bytes()
                   for f in files):
            break
        first = prev
    return first


def _stage_closure(stage, relpath: str) -> tuple[str, ...]:
    """relpath (posix, inside the stage folder `stage`) and every module of the stage it imports through
    relative imports, transitively: the files that decide what a stage's test checks."""
    import ast

    seen, todo = set(), [relpath]
    while todo:
        rel = todo.pop()
        if rel in seen:
            continue
        seen.add(rel)
        path = stage / rel
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.ImportFrom) or not node.level:
                continue
            base = path.parent
            for _ in range(node.level - 1):
                base = base.parent
            if node.module:
                base = base.joinpath(*node.module.split("."))
                targets = [base]
            else:
                targets = [base / a.name for a in node.names]
            for t in targets:
                for f in (t.with_suffix(".py"), t / "__init__.py"):
                    if f.is_file() and stage in f.parents:
                        todo.append(f.relative_to(stage).as_posix())
                        break
    return tuple(sorted(seen))


def cases(argnames: str, argvalues):
    """A decorator in place of `pytest.mark.parametrize(argnames, argvalues)` for sizes and shapes: the test is
    collected once and calls its body for every case (the product of every `cases` stacked on it, the top one
    outermost), with the same arguments a parametrised case would get; the fixtures are requested once, so a
    function-scoped one (rng) is shared by the cases. Where any case fails (an assertion, any other error, or
    pytest.fail), raise one AssertionError naming the first failing case by its parameters and its error (chained,
    so its traceback shows), how many cases failed, and the next few. A case that calls pytest.skip is left out;
    the test is skipped only where every case is. A parametrisation that separates different things (a kernel
    kind) stays pytest's, above or below these."""
    import functools
    import inspect
    import itertools

    import pytest

    names = [n.strip() for n in argnames.split(",")] if isinstance(argnames, str) else list(argnames)
    rows = []
    for v in argvalues:
        if isinstance(v, type(pytest.param(None))):
            if v.marks:
                raise TypeError(f"cases({argnames!r}): a value with marks ({v.marks}) needs pytest.mark.parametrize")
            v = v.values if len(names) > 1 else v.values[0]
        rows.append(tuple(v) if len(names) > 1 else (v,))
        if len(rows[-1]) != len(names):
            raise TypeError(f"cases({argnames!r}): {v!r} is not {len(names)} values")
    if not rows:
        raise TypeError(f"cases({argnames!r}): no values")

    def decorate(fn):
        inner = getattr(fn, "_cases_inner", fn)
        axes = [(names, rows)] + getattr(fn, "_cases_axes", [])
        given = [n for ns, _ in axes for n in ns]
        sig = inspect.signature(inner)
        missing = [n for n in given if n not in sig.parameters]
        if missing or len(set(given)) < len(given):
            raise TypeError(f"{inner.__name__}: cases {given} not each one of its parameters once")

        def test(*args, **kwargs):
            failures, skips, n = [], [], 0
            for combo in itertools.product(*(r for _, r in axes)):
                case = {name: value for (ns, _), row in zip(axes, combo) for name, value in zip(ns, row)}
                n += 1
                try:
                    inner(*args, **kwargs, **case)
                except pytest.skip.Exception as e:
                    skips.append((case, e))
                except (Exception, pytest.fail.Exception) as e:
                    failures.append((case, None if failures else e))    # a later error's frames (and the
                    #                                                        device arrays they hold) are let go
            if failures:
                (case, err), others = failures[0], [_case_name(c) for c, _ in failures[1:4]]
                then = f" (then {'; '.join(others)}{'; ...' if len(failures) > 4 else ''})" if others else ""
                raise AssertionError(f"{_case_name(case)} fails, the first of {len(failures)} failing cases of {n}"
                                     f"{then}: {type(err).__name__}: {err}") from err
            if skips and len(skips) == n:
                pytest.skip(f"all {n} cases: {skips[0][1]}")
            for case, e in skips:
                print(f"skipped {_case_name(case)}: {e}")

        functools.update_wrapper(test, fn)
        test._cases_inner, test._cases_axes = inner, axes
        test.__signature__ = sig.replace(parameters=[p for p in sig.parameters.values() if p.name not in given])
        return test

    return decorate


def _case_name(case: dict) -> str:
    """`M=3, N=37, K=264`: one case's parameters, each value's repr cut at 60 characters."""
    def short(v):
        r = repr(v)
        return r if len(r) <= 60 else r[:57] + "..."

    return ", ".join(f"{k}={short(v)}" for k, v in case.items())


_REMEMBERED: dict = {}   # a model's fingerprint -> its memo of logits by token sequence, for the whole process


def remember_logits(reference, size: int = 2048):
    """`reference` (a ReferenceEngine) with its model's last_logits(token_ids) answered from a memo of the last
    `size` token sequences asked of a model with the same config and weights (a copy each time), and returned.
    The numpy model's logits are a function of its config, its weights and the tokens alone, and the engine tests
    ask for each sequence's logits again and again: the reference engine's own run, then the engine under test's
    rows (the same histories where the engine is right; any other history misses and is computed), again where a
    preemption recomputes a request, and again in the next stage's copy of the test, which runs the same workloads
    over the same session checkpoint. 0.5 MB a sequence at the 128K vocabulary: 1 GB at most."""
    import hashlib
    from collections import OrderedDict

    model = reference.model
    h = hashlib.sha256(repr(model.config).encode())
    for name in sorted(model.w):
        h.update(name.encode())
        h.update(np.ascontiguousarray(model.w[name]).tobytes())
    memo = _REMEMBERED.setdefault(h.hexdigest(), OrderedDict())
    compute = model.last_logits

    def last_logits(token_ids):
        key = tuple(int(t) for t in token_ids)
        if key in memo:
            memo.move_to_end(key)
        else:
            memo[key] = compute(list(key))
            while len(memo) > size:
                memo.popitem(last=False)
        return memo[key].copy()

    model.last_logits = last_logits
    return reference
