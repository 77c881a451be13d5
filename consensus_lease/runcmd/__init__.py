"""``consensus-lease run``: run a command only while holding a job's lease (see
:mod:`.command`), with a deadline guard process that kills it in time (:mod:`.guard`)."""
