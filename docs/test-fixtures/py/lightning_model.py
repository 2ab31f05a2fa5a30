"""docs-test fixture: a tiny LightningModule and its DataLoader (CPU, two
batches)."""

import lightning
import torch


class TinyModel(lightning.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


model = TinyModel()
train_loader = torch.utils.data.DataLoader(
    torch.utils.data.TensorDataset(torch.randn(16, 8), torch.randn(16, 1)), batch_size=8
)
