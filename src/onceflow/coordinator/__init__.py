"""Coordinators: state machines replayed from their own logs.

`group` is the classic consumer-group protocol with committed offsets;
`transaction` is the two-phase-commit transaction coordinator. Both sit on the
log layer and know nothing of sockets or the event loop: delayed answers are
callbacks, and time comes in as `now_ms`.
"""
