"""Read receipts (`SynthesisConfig.read_receipts`): a gRPC stream whose client says what it has
received, so that a client that stops reading is found within the stall timeout.

HTTP/2 flow control is no guard: grpc's clients grow their receive window by bandwidth probing
to megabytes, which take a minute or more of audio before the server's writes wait. With
receipts on, a call's writes wait while the audio written runs more than LEAD_S past the last
receipt (`ReceiptGate.room_for`), so the doors' own stall timeout sees them wait. Receipts are
waited for only while the client's requests are open: after a half-close none can come.

A call ends (its status goes) once the client has receipted all its audio, and, when its text
has ended (TextInput.last), once it has half-closed (`settled`, SETTLE_S at most): a status
that meets a request on its way fails the client's call in grpc (INTERNAL, grpc/grpc#36066)
where it should end it cleanly, and a resume that replays the end of a stream meets the text
its client sends again.
"""

from __future__ import annotations

import asyncio
import contextlib

from ..stream.events import AudioOut, SessionEvent

LEAD_S = 2.0
"""Audio a call may write past the client's last receipt."""
SETTLE_S = 2.0
"""The longest a call waits at its end for the receipt of its last audio and, after its text's
`last`, for the client's half-close."""


class ReceiptGate:
    """One call's receipts; it gates nothing unless `enabled`."""

    def __init__(self, received: int = 0) -> None:
        self.enabled = False
        self.requests_open = True
        self.received = received
        """Samples the client has received (its last receipt, or a resume's offset)."""
        self.written = received
        """Samples of the stream written to the client."""
        self._changed = asyncio.Event()

    def receipt(self, sample_offset: int) -> None:
        if sample_offset > self.received:
            self.received = sample_offset
            self._notify()

    def requests_ended(self) -> None:
        """The client half-closed (or went away): no receipt can come any more."""
        self.enabled = False
        self.requests_open = False
        self._notify()

    async def room_for(self, event: SessionEvent) -> None:
        """Return once `event` may be written: at once unless it is audio beginning more than
        LEAD_S past the last receipt."""
        if not isinstance(event, AudioOut):
            return
        lead = round(LEAD_S * event.sample_rate_hz)
        while self.enabled and event.sample_offset - self.received > lead:
            await self._changed.wait()
        self.written = max(self.written, event.sample_offset + event.num_samples)

    async def settled(self, text_ended: bool = False) -> None:
        """Return once the client has receipted all the audio written (or sends no more
        receipts) and, if its text has ended, half-closed; SETTLE_S at most."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(SETTLE_S):
                await self._quiet(text_ended)

    async def _quiet(self, text_ended: bool) -> None:
        while (self.enabled and self.received < self.written) or (
            text_ended and self.requests_open
        ):
            await self._changed.wait()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()
