"""How often does HF transformers' own bf16 forward pick the float32 reference's top-1 on the 1B synthetic shape?
A CPU experiment (torch CPU, about 2 minutes, plus writing the 2.47 GB checkpoint once): it shows what top-1
agreement a bf16 engine reaches on these random weights, the yardstick for stage02's 1B test against HF.

    python scripts/hf_top1_agreement.py
"""
import time

import numpy as np
import torch
import transformers

from common.checkpoint import Checkpoint
from common.reference import ReferenceModel
from common.synthetic import resolve_model
from common.testing import NEAR_TIE, top1_margin

t = time.time()
folder = resolve_model("llama-3.2-1b")
ids = [128000] + np.random.default_rng(4).integers(0, 128000, 199).tolist()   # the GPU test's prompt_ids(200, seed=4)
ref = ReferenceModel(Checkpoint(folder)).forward(ids)
print(f"float32 reference: {time.time() - t:.0f} s", flush=True)
m = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16, attn_implementation="sdpa").eval()
with torch.no_grad():
    hf = m(torch.tensor([ids])).logits[0].float().numpy()
decided = top1_margin(ref) >= NEAR_TIE
same = hf.argmax(-1) == ref.argmax(-1)
err = np.linalg.norm(hf - ref, axis=-1) / np.linalg.norm(ref, axis=-1)
print(f"HF bf16 (CPU, sdpa) vs fp32 reference, 1B shape, 200 positions: top-1 agreement {same.mean():.3f} at all, "
      f"{same[decided].mean():.3f} at the {decided.sum()} decided; rel L2 max {err.max():.2e} mean {err.mean():.2e}")
