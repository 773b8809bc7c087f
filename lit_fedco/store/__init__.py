"""What a run leaves on disk, made to survive crashes: atomic files and the run folder's lock
(:mod:`~lit_fedco.store.files`), checkpoints (:mod:`~lit_fedco.store.checkpoint`) and the
per-round record (:mod:`~lit_fedco.store.history`). It knows file formats, not runs: which
folder a run writes into, what resumes and who writes are the experiment layer's
(:mod:`lit_fedco.experiment`)."""
