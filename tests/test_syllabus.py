"""The course's syllabus: every topic it promises, and the chapter section that teaches it. A chapter rewrite that
drops a topic, or renames its section so that nobody can find it, fails here, naming the topic.

A topic is taught by a section (a `## ` heading, numbered or not) whose heading holds the given words, and whose
text says each of the given terms (case-insensitive). Headings are matched by their words, not their numbers, so
sections may be renumbered freely."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# (topic, chapter folder, words of the section's heading, terms its text must say)
SYLLABUS = [
    ("bfloat16", "stage01_loading", "bfloat16", ("exponent", "mantissa")),
    ("GPU and CPU memory", "stage01_loading", "host memory, device memory", ("pinned", "copy")),
    ("tokenisation", "stage02_forward", "from text to hidden rows", ("tokeniz", "BPE")),
    ("embeddings", "stage01_loading", "embedding lookup", ("gather", "row")),
    ("RMSNorm's parallel reduction", "stage02_forward", "rmsnorm and the parallel reduction",
     ("warp", "shared memory")),
    ("RoPE", "stage02_forward", "rope", ("rotat", "wavelength")),
    ("residuals", "stage02_forward", "residual connections", ("residual",)),
    ("cublasGemmEx and the column-major trick", "stage02_forward", "cublasgemmex and the column-major trick",
     ("column-major", "transpose")),
    ("SiLU and the feed-forward network", "stage02_forward", "silu and the feed-forward network",
     ("gate", "down")),
    ("softmax", "stage02_forward", "softmax without overflow", ("max",)),
    ("the causal mask", "stage02_forward", "the causal mask", ("causal",)),
    ("argmax", "stage02_forward", "argmax and sampling", ("argmax", "temperature")),
    ("buffer reuse", "stage02_forward", "buffer reuse", ("buffer",)),
    ("grouped-query attention", "stage02_forward", "grouped-query attention", ("key/value heads",)),
    ("prefill against decode", "stage03_kvcache", "prefill and decode", ("prefill", "decode")),
    ("the KV cache", "stage03_kvcache", "the cache, and what it costs", ("bytes",)),
    ("static batching", "stage04_static_batch", "the waste static batching leaves", ("padding",)),
    ("continuous batching", "stage05_continuous_batch", "iteration-level scheduling", ("iteration", "finishes")),
    ("chunked prefill", "stage05_continuous_batch", "chunked prefill", ("budget",)),
    ("online softmax", "stage06_online_softmax", "online softmax", ("running max",)),
    ("flash-decoding", "stage06_online_softmax", "flash-decoding", ("split", "combine")),
    ("the paged KV cache", "stage07_paged_attention", "block tables", ("slot mapping", "block_size")),
    ("the paged attention kernel", "stage07_paged_attention", "paged kernel", ("block_tables",)),
    ("preemption by recompute", "stage07_paged_attention", "preemption", ("recompute",)),
    ("CUDA graphs: capture and replay", "stage08_cuda_graphs", "record the step once", ("capture", "replay")),
    ("padding rows of a graph", "stage08_cuda_graphs", "padding rows that write nowhere", ("padding", "slot")),
    ("asynchronous scheduling", "stage09_async_scheduling", "launch step t+1 before reading step t",
     ("placeholder",)),
    ("placeholders and the step's record", "stage09_async_scheduling", "placeholders", ("advance", "record")),
    ("the persistent batch", "stage09_async_scheduling", "the persistent batch: a row a seq_slot",
     ("InputBatch", "prepare")),
    ("a kernel against its floor", "stage10_fused_kernels", "a floor for every kernel", ("floor",)),
    ("kernel fusion and programmatic dependent launch", "stage10_fused_kernels", "the kernels one by one",
     ("one kernel", "griddepcontrol")),
    ("prefix caching: a block named by its tokens", "stage11_prefix_caching", "name a block by its tokens",
     ("sha256", "parent")),
    ("eviction of cached blocks", "stage11_prefix_caching", "eviction", ("least recently",)),
    ("Hopper's pipeline: wgmma, TMA, mbarriers, warp specialisation", "stage12_hopper_attention",
     "hopper's pipeline", ("wgmma", "tma", "mbarrier", "producer")),
    ("a wgmma operand in shared memory", "stage12_hopper_attention", "the instructions",
     ("descriptor", "swizzle")),
    ("tensor parallelism: column- and row-parallel layers", "stage13_tensor_parallel", "cut every gemm",
     ("column-parallel", "row-parallel", "all-reduce")),
    ("the all-reduce's cost", "stage13_tensor_parallel", "the all-reduce", ("latency", "bandwidth")),
    ("one process a GPU: rank 0 schedules, every rank samples the gathered logits", "stage13_tensor_parallel",
     "one process a gpu", ("pipe", "all-gather", "sampler", "abort")),
]


def sections(chapter: Path) -> dict[str, str]:
    """heading (lower case, its number dropped) -> the section's text, for every `## ` heading."""
    parts = re.split(r"^## (.*)$", chapter.read_text(), flags=re.M)
    return {re.sub(r"^\d+\.\s*", "", head).strip().lower(): body for head, body in zip(parts[1::2], parts[2::2])}


@pytest.mark.parametrize("topic, stage, heading, terms", SYLLABUS, ids=[t[0] for t in SYLLABUS])
def test_every_topic_has_its_section(topic, stage, heading, terms):
    found = {h: body for h, body in sections(ROOT / stage / "README.md").items() if heading in h}
    assert found, f"{topic}: no section of {stage}/README.md has '{heading}' in its heading"
    text = " ".join(found.values()).lower()
    missing = [t for t in terms if t.lower() not in text]
    assert not missing, f"{topic}: {stage}/README.md's section '{next(iter(found))}' never says {missing}"


def test_the_check_finds_a_missing_section(tmp_path):
    chapter = tmp_path / "README.md"
    chapter.write_text("# A chapter\n\n## 1. bfloat16\n\nsign, exponent, mantissa\n\n## 2. Other\n\ntext\n")
    assert list(sections(chapter)) == ["bfloat16", "other"] and "mantissa" in sections(chapter)["bfloat16"]
    assert not [h for h in sections(chapter) if "rmsnorm" in h]
