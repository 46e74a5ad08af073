# Writes compiled.et.json.gz: a training step whose forward is a torch.compile'd function (its
# fused elementwise kernels are Inductor's, recorded in the ET only as the regions' annotations).
# Run with PyTorch 2.11 and the mystique wheel installed; then gzip the ET.
import torch, mystique, torch.nn.functional as F
torch.manual_seed(0); torch.set_num_threads(1)
w = torch.randn(256, 256, requires_grad=True)
x = torch.randn(64, 256)
@torch.compile
def f(x, w):
    h = x @ w
    return (F.gelu(h) * torch.sigmoid(h) + h.tanh()).pow(2).mean()
def step():
    f(x, w).backward()
mystique.capture(step, out=".", name="compiled")
