"""A stream's GPT hidden states, held until the Decoder has read them."""

from __future__ import annotations

from torch import Tensor


class HiddenBuffer:
    """Hidden states (tokens, D) in generation order, in one tensor grown by doubling. Tokens
    before the one a caller still needs are dropped when room runs out, and on `drop_before`."""

    def __init__(self) -> None:
        self._rows: Tensor | None = None  # (capacity, D), row 0 is token _start
        self._start = 0
        self.num_tokens = 0  # tokens pushed so far

    @property
    def held(self) -> int:
        """Rows held (tokens not yet dropped)."""
        return 0 if self._rows is None else self.num_tokens - self._start

    def push(self, hidden: Tensor, keep_from: int) -> None:
        """Append hidden states (n, D); room is made by dropping tokens before `keep_from`,
        then by growing. Rows keep the first push's device and dtype."""
        if hidden.dim() != 2:
            raise ValueError(f"expected (n, D) hidden states, got shape {tuple(hidden.shape)}")
        n = hidden.shape[0]
        if self._rows is None:
            self._rows = hidden.new_empty((max(64, 2 * n), hidden.shape[1]))
        if self.held + n > self._rows.shape[0]:
            self.drop_before(keep_from)
            used = self.held
            if used + n > self._rows.shape[0]:
                grown = self._rows.new_empty(
                    (max(2 * self._rows.shape[0], used + n), self._rows.shape[1])
                )
                grown[:used] = self._rows[:used]
                self._rows = grown
        used = self.held
        self._rows[used : used + n] = hidden.to(device=self._rows.device, dtype=self._rows.dtype)
        self.num_tokens += n

    def drop_before(self, token: int) -> None:
        """Drop the tokens before `token`."""
        keep_from = max(self._start, token)
        drop = keep_from - self._start
        if self._rows is not None and drop > 0:
            used = self.num_tokens - keep_from
            self._rows[:used] = self._rows[drop : drop + used].clone()
            self._start = keep_from

    def window(self, ta: int, tb: int) -> Tensor:
        """Hidden states of tokens [ta, tb), a view of the buffer."""
        assert self._rows is not None and ta >= self._start
        return self._rows[ta - self._start : tb - self._start]

    def release(self) -> None:
        self._rows = None
