"""attention_hopper.cu as the assembler builds it for sm_90a, on any machine: its wgmma instructions stay
asynchronous and nothing spills. ptxas reports a "Potential Performance Loss" where it had to serialise wgmma
instructions (an accumulator or operand register touched while a product may be in flight, or too few
registers) and says where it injected a wait: the overlap the kernel is written for would then be gone, silently,
at a small cost to correctness nowhere and to speed everywhere."""
from pathlib import Path

from common.compile import arch_for, ptxas_report

KERNEL = Path(__file__).resolve().parents[1] / "kernels" / "attention_hopper.cu"


def test_every_wgmma_stays_asynchronous_and_nothing_spills():
    report = ptxas_report(KERNEL, arch_for(KERNEL, "sm_90"))
    for hd in (64, 128):
        assert f"Compiling entry function 'attention_hopper_hd{hd}'" in report, report
    assert "Performance Loss" not in report and "wait_group is injected" not in report, report
    spills = [line for line in report.splitlines() if "spill stores" in line]
    assert len(spills) == 2 and all("0 bytes spill stores, 0 bytes spill loads" in line for line in spills), report
