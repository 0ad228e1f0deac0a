"""CPU: the decode graphs' inputs through the real loop. A numpy runner (test_llm_engine_cpu's) takes every decode
step the way a graph does: packed into the fixed layout of the smallest captured size that holds it (pack_decode),
then read back from that layout alone, as the graph's kernels read it; padding rows must write nothing. Whatever
the arrivals, chunking and preemption, every request gets exactly the tokens the numpy reference engine gives it
alone, and no decode step brings more block-table updates than it has rows (the bound of the inputs layout). The
engine schedules asynchronously, as the GPU engine does by default: decode rows name their token by the step
before's sampled id (prev_rows), which must come through the layout too."""
import numpy as np

from ..graphs import capture_sizes, decode_layout, graph_size, is_decode_step, pack_decode
from ..packing import StepInputs
from .test_llm_engine_cpu import NumpyRunner, engine, reference, workload  # noqa: F401 (reference: a fixture)


class GraphInputsRunner(NumpyRunner):
    def __init__(self, runner: NumpyRunner, max_num_seqs: int):
        self.__dict__.update(runner.__dict__)
        self.sizes, self.replayed = capture_sizes(max_num_seqs), []

    def launch(self, x):
        if not is_decode_step(x):
            return super().launch(x)                         # prompt chunks run eagerly
        R, size = x.num_rows, graph_size(x.num_rows, self.sizes)
        assert len(x.table_updates) <= R                     # at most one new block a decode row
        host, lay = pack_decode(x, size, keys_per_split=96), decode_layout(size)

        def field(name):
            first, count = lay[name]
            return host[first:first + count]

        tiles, slots = field("tiles").reshape(size, 4), field("slot_mapping")
        assert (slots[R:] == -1).all() and (field("logit_rows") == np.arange(size)).all()
        assert (tiles[:, :2] == np.stack([np.arange(size), np.ones(size)], 1)).all()
        assert (tiles[R:, 2:] == 0).all() and field("keys_per_split")[0] == 96
        written = slots >= 0                                 # the cache write skips -1: padding rows write nothing
        prev = field("prev_rows")
        assert (prev[R:] == -1).all()                        # padding rows take no sampled id
        step = StepInputs(field("tokens")[written], field("positions")[written], slots[written], tiles[written, 2],
                          np.arange(R, dtype=np.int32), field("logit_seq_slots")[:R], field("counters")[:R],
                          tiles[written], host[lay["updates"][0]:].reshape(-1, 2), prev[written])
        assert (step.positions == tiles[:R, 3]).all() and (step.seq_slots == x.seq_slots).all()
        self.replayed.append((R, size))
        return super().launch(step)


def graph_engine(ref, **kw):
    eng, runner = engine(ref, async_scheduling=True, **kw)
    eng.runner = GraphInputsRunner(runner, kw.get("max_num_seqs", 3))
    return eng, eng.runner


def test_requests_through_the_graph_layout_get_the_tokens_they_get_alone(reference):  # noqa: F811
    prompts, params = workload(n=12, seed=4)
    want = reference.generate(prompts, params)
    eng, runner = graph_engine(reference, max_num_seqs=5, max_num_batched_tokens=16)
    got = eng.generate(prompts, params)
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    assert len(runner.replayed) >= 5 and any(r < size for r, size in runner.replayed)   # some of them padded
    assert sum(runner.pending_rows) > 0


def test_preemption_and_arrivals_through_the_graph_layout(reference):  # noqa: F811
    """Three seq_slots' worth of requests on a pool of 14 blocks of 4 positions: preempted and recomputed, each
    readmission's table sent again, decode steps of 1..5 rows through the layout."""
    prompts, params = workload(n=10, seed=9)
    want = reference.generate(prompts, params)
    eng, runner = graph_engine(reference, max_num_seqs=5, max_num_batched_tokens=16, num_blocks=14)
    ids, got, k = [], {}, 0
    while k < len(prompts) or eng.has_unfinished_requests():
        if k < len(prompts):
            ids.append(eng.add_request(prompts[k], params[k]))
            k += 1
        for out in eng.step():
            if out.finished:
                got[out.request_id] = out
    assert [got[i].token_ids for i in ids] == [w.token_ids for w in want]
    assert eng.scheduler.stats.preemptions > 0 and runner.replayed
