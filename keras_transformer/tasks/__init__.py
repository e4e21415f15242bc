"""Whole jobs built from the floors below: constituency parsing (`parsing.py`, scored by
`evalb.py`) and the Multi30k main job behind `keras-transformer demo` (`main_job.py`)."""
