"""A 2-layer transformer LM on a synthetic next-token task, trained with muon_opt.torch.Muon
(its defaults), torch.optim.AdamW and torch.optim.Muon (Moonlight's ``match_rms_adamw``
scale, with AdamW for the embedding, head and norms), each at the learning rates given;
prints a markdown table of the loss every ``--every`` steps and the largest attention logit.

    PYTHONPATH=<torch> python3 bindings/python/examples/compare_lm.py [--steps 60] [--lrs 1e-3,3e-3,1e-2]

``--check`` exits non-zero unless, at every lr, muon_opt's last loss is within 5 % of
torch.optim.Muon's and below its own first (the claims bindings/python/README.md makes).
"""

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import muon_opt as mo  # noqa: E402
from muon_opt.torch import DEFAULT_LR, Muon  # noqa: E402

VOCAB, WIDTH, HEADS, SEQ, BATCH = 48, 64, 4, 32, 16


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1, self.norm2 = torch.nn.LayerNorm(WIDTH), torch.nn.LayerNorm(WIDTH)
        self.qkv = torch.nn.Linear(WIDTH, 3 * WIDTH, bias=False)
        self.proj = torch.nn.Linear(WIDTH, WIDTH, bias=False)
        self.fc1 = torch.nn.Linear(WIDTH, 4 * WIDTH, bias=False)
        self.fc2 = torch.nn.Linear(4 * WIDTH, WIDTH, bias=False)
        self.max_logit = 0.0

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, HEADS, WIDTH // HEADS).unbind(2)
        q, k, v = (z.transpose(1, 2) for z in (q, k, v))
        logits = q @ k.transpose(-1, -2) / (WIDTH // HEADS) ** 0.5
        self.max_logit = max(self.max_logit, float(logits.detach().abs().max()))
        mask = torch.ones(t, t, dtype=torch.bool).triu(1)
        att = logits.masked_fill(mask, float("-inf")).softmax(-1) @ v
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, WIDTH))
        return x + self.fc2(torch.relu(self.fc1(self.norm2(x))))


class LM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, WIDTH)
        self.blocks = torch.nn.ModuleList([Block(), Block()])
        self.norm = torch.nn.LayerNorm(WIDTH)
        self.head = torch.nn.Linear(WIDTH, VOCAB, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def data(step):
    """Sequences where token i+1 = (a · token i + b) mod VOCAB, (a, b) per sequence."""
    g = torch.Generator().manual_seed(step)
    a = torch.randint(1, 8, (BATCH, 1), generator=g)
    b = torch.randint(0, VOCAB, (BATCH, 1), generator=g)
    first = torch.randint(0, VOCAB, (BATCH, 1), generator=g)
    seq = [first]
    for _ in range(SEQ):
        seq.append((a * seq[-1] + b) % VOCAB)
    seq = torch.cat(seq, 1)
    return seq[:, :-1], seq[:, 1:]


def optimizers(model, name, lr, group):
    matrices = [p for n, p in model.named_parameters() if p.dim() == 2 and "embed" not in n and "head" not in n]
    rest = [p for n, p in model.named_parameters() if not any(p is m for m in matrices)]
    if name == "muon_opt":
        return [Muon(model, group[0], embedding_or_output=["head.weight"], lr=lr)]
    if name == "torch AdamW":
        return [torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1)]
    return [torch.optim.Muon(matrices, lr=lr, weight_decay=0.1, adjust_lr_fn="match_rms_adamw"),
            torch.optim.AdamW(rest, lr=lr, weight_decay=0.1)]


def train(name, lr, steps, every):
    torch.manual_seed(0)
    model = LM()
    with mo.HostGroup(1) as group:
        opts = optimizers(model, name, lr, group)
        losses = []
        for step in range(steps):
            tokens, targets = data(step)
            model.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(tokens).flatten(0, 1), targets.flatten())
            loss.backward()
            for opt in opts:
                opt.step()
            if step % every == every - 1:
                losses.append(float(loss.detach()))
        if name == "muon_opt":
            opts[0].close()
    return losses, max(b.max_logit for b in model.blocks)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--every", type=int, default=20)
    parser.add_argument("--lrs", default=f"1e-3,{DEFAULT_LR},1e-2")
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    lrs = [float(v) for v in args.lrs.split(",")]
    marks = [str(s) for s in range(args.every, args.steps + 1, args.every)]
    print("| optimizer | lr | " + " | ".join(f"loss @ {m}" for m in marks) + " | max logit |")
    print("|---|---|" + "---|" * len(marks) + "---|")
    final, first = {}, {}
    for name in ("muon_opt", "torch Muon", "torch AdamW"):
        for lr in lrs:
            losses, logit = train(name, lr, args.steps, args.every)
            final[name, lr] = losses[-1]
            if name == "muon_opt":
                first[lr] = losses[0]
            print(f"| {name} | {lr:g} | " + " | ".join(f"{v:.3f}" for v in losses) + f" | {logit:.1f} |")
    for lr in lrs if args.check else ():
        ours, theirs = final["muon_opt", lr], final["torch Muon", lr]
        if abs(ours - theirs) > 0.05 * theirs or ours >= first[lr]:
            sys.exit(f"lr {lr}: muon_opt ends at {ours:.3f} (first {first[lr]:.3f}), torch Muon at {theirs:.3f}")


if __name__ == "__main__":
    main()
