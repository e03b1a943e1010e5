"""A `transformers` Trainer on a tiny BERT built from a config (nothing downloaded): the
DataLoader, the optimizer, the precision and the compile step all belong to the Trainer."""

import argparse
import tempfile

import torch
from torch.utils.data import Dataset
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments


class RandomTokens(Dataset):
    def __init__(self, size=256, length=32, vocab=512):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (size, length), generator=g)
        self.labels = torch.randint(0, 2, (size,), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": torch.ones_like(self.ids[i]), "labels": self.labels[i]}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    args = p.parse_args()
    config = BertConfig(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128, num_labels=2)
    model = BertForSequenceClassification(config)
    with tempfile.TemporaryDirectory() as out:
        training_args = TrainingArguments(
            output_dir=out, max_steps=args.steps, per_device_train_batch_size=16, learning_rate=5e-4,
            use_cpu=True, report_to=[], save_strategy="no", logging_strategy="no", disable_tqdm=True,
        )
        trainer = Trainer(model=model, args=training_args, train_dataset=RandomTokens())
        trainer.train()
    print(f"done: {trainer.state.global_step} steps")


if __name__ == "__main__":
    main()
