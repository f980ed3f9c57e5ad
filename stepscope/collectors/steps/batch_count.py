"""Samples per step, counted from the batches the job's DataLoaders hand out.

Batches are counted per dataset, and a step's batch is that of the dataset it fetched
last (its training data): a validation pass between two steps (imagenet's
``validate()``, Lightning's val check) fetches batches that are not training samples.

Loaders that fetch one batch ahead (accelerate's ``DataLoaderShard``, as in Hugging
Face's Trainer; Lightning's prefetching fetcher) put two batches in the first step
where it used one: once step 1 shows it, step 0 is corrected, and from then on each
epoch's first fetch is not counted (it is a batch used one step later) while its end
counts the batch fetched before.

Runs on the job's hot path (every ``next()`` of a loader): counting only.
"""

from __future__ import annotations

from typing import Any


class BatchCounter:
    """The step timer's count of samples and batches since the last step."""

    def __init__(self) -> None:
        self.tensor_type: type | None = None  # torch.Tensor, set when the timer installs
        self._ds_samples: dict[int, int] = {}
        self._ds_batches: dict[int, int] = {}
        self._last_ds: int | None = None
        self._last_batch = 0  # size of the last batch fetched
        self.look_ahead = False  # the training loader is read one batch ahead
        self._skip_first: set[int] = set()  # datasets whose next batch is fetched ahead
        self._first_row: dict[str, Any] | None = None  # step 0, for the look-ahead check

    def on_new_iterator(self, dataset: Any) -> None:
        """A loader starts an epoch: a look-ahead loader's first fetch is ahead."""
        if self.look_ahead:
            self._skip_first.add(id(dataset))

    def count(self, ds: int, batch: Any) -> None:
        """One batch of dataset ``ds`` for this step (``batch`` None: a look-ahead loader
        ran out, and the step uses the batch it fetched before).

        A look-ahead loader (accelerate's ``DataLoaderShard`` in Hugging Face's Trainer)
        fetches the next batch before it yields the current one: each epoch's first
        fetch is a batch used one step later (not counted), and its last step fetches
        nothing (the batch fetched before is counted then).
        """
        if batch is None:
            n = self._last_batch if ds == self._last_ds else None
        else:
            n = self.batch_len(batch)
            if ds in self._skip_first:
                self._skip_first.discard(ds)
                self._last_ds, self._last_batch = ds, n or 0
                return
        if not n:
            return
        self._ds_samples[ds] = self._ds_samples.get(ds, 0) + n
        self._ds_batches[ds] = self._ds_batches.get(ds, 0) + 1
        self._last_ds, self._last_batch = ds, n

    def batch_len(self, batch: Any, depth: int = 0) -> int | None:
        tensor_type = self.tensor_type
        if isinstance(batch, tensor_type):
            return int(batch.shape[0]) if batch.dim() > 0 else None
        if depth >= 2:
            return None
        if isinstance(batch, dict):
            items = batch.values()
        elif isinstance(batch, (list, tuple)):
            items = batch
        else:
            return None
        for item in items:
            n = self.batch_len(item, depth + 1)
            if n is not None:
                return n
        return None

    def take(self) -> tuple[int, int, int]:
        """(samples, batches) of the step's training dataset and the last batch's size;
        the step's counts start again from zero."""
        taken = (
            self._ds_samples.get(self._last_ds, 0),
            self._ds_batches.get(self._last_ds, 0),
            self._last_batch,
        )
        self._ds_samples = {}
        self._ds_batches = {}
        return taken

    def check_look_ahead(self, row: dict[str, Any]) -> dict[str, Any] | None:
        """Loaders that fetch one batch ahead (accelerate's ``DataLoaderShard``, as in
        Hugging Face's Trainer; Lightning's prefetching fetcher) put two batches in
        the first step where it used one: step 0 is corrected by step 1's count.

        Returns step 0's row, corrected, when it must be written again."""
        if row["step"] == 0:
            self._first_row = row
            return None
        first, self._first_row = self._first_row, None
        if first is None or row["step"] != 1 or not first["_batches"] or not row["_batches"]:
            return None
        if first["_batches"] == row["_batches"] + 1 and first["batch_size"]:
            self.look_ahead = True
            first["batch_size"] -= first["_last_batch"]
            return first
        return None

    def forget_first_row(self) -> None:
        """Step 0 was taken back: the next step 0 is the one to check."""
        self._first_row = None
