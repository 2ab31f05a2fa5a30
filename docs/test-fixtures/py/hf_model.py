"""docs-test fixture: what the Hugging Face blocks take from a training
script — a tiny GPT-2 (built from a config: nothing is downloaded), its
datasets, an optimizer, a loader of batches, an evaluation, an epoch count
and the Trainer's arguments."""

import torch
from transformers import GPT2Config, GPT2LMHeadModel

torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=64, n_positions=16))


def _sample(i: int) -> dict:
    ids = torch.arange(16) % 64
    return {"input_ids": ids, "labels": ids}


train = [_sample(i) for i in range(16)]
valid = [_sample(i) for i in range(4)]
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
loader = torch.utils.data.DataLoader(train, batch_size=8)
epochs = 2


def evaluate(model: torch.nn.Module) -> None:
    with torch.no_grad():
        for batch in torch.utils.data.DataLoader(valid, batch_size=4):
            model(**batch)
