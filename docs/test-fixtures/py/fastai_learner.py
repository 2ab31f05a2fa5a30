"""docs-test fixture: `learn`, a stand-in for a fastai Learner (fastai is
not installed here): fit(n) runs n epochs of a small CPU workload."""


class Learner:
    def fit(self, n_epoch: int) -> None:
        for _ in range(n_epoch):
            held = bytearray(16 << 20)
            del held


learn = Learner()
