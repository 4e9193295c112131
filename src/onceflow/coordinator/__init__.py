"""Coordinators: state machines replayed from their own logs.

`group` is the classic consumer-group protocol with committed offsets;
`transaction` is the two-phase-commit transaction coordinator. Both write, then
apply, through `runtime`: a change takes effect only once its record is in the
log. They know nothing of sockets or the event loop: delayed answers are
callbacks, what to wait for is handed back to the caller, and time comes in as
`now_ms`.
"""
