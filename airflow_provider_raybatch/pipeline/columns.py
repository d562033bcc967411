"""The internal columns rows carry through the stages, never shown to a predictor.

The range a row belongs to (so the driver knows when a range is complete), the input columns
kept for the output (so a predictor in the style of Ray's guide, which returns only its outputs,
still gets them written beside its results), and, once a stage rejects a row, why.

A stage rejects rows by returning a column ``REJECT_COLUMN`` holding a reason (None for rows it
accepts) and optionally ``REJECT_KIND_COLUMN`` (``INVALID_INPUT`` or ``ENGINE_ERROR``, the
default). Later stages never see rejected rows; they are written to the rejects output.

A stage that runs a token-based model reports what each row cost by returning
``TOKENS_IN_COLUMN`` (prompt tokens) and ``TOKENS_OUT_COLUMN`` (generated tokens), integers or
None (not counted). Counts of several stages add up. They are summed per range into its commit
record, so an output's totals count each committed row once, whatever its tries spent.
"""

from __future__ import annotations

INTERNAL_PREFIX = "__raybatch_"
RANGE_COLUMN = "__raybatch_range"
KEEP_PREFIX = "__raybatch_keep:"
#: Why a stage rejected a row (null: accepted).
REJECT_COLUMN = "__raybatch_reject"
#: What kind of rejection: INVALID_INPUT (never reached a model) or ENGINE_ERROR (a model failed on it).
REJECT_KIND_COLUMN = "__raybatch_reject_kind"
INVALID_INPUT = "invalid_input"
ENGINE_ERROR = "engine_error"
REJECT_COLUMNS = (REJECT_COLUMN, REJECT_KIND_COLUMN)
#: Tokens a row cost in a model: its prompt's, and those generated (null: not counted).
TOKENS_IN_COLUMN = "__raybatch_tokens_in"
TOKENS_OUT_COLUMN = "__raybatch_tokens_out"
TOKEN_COLUMNS = (TOKENS_IN_COLUMN, TOKENS_OUT_COLUMN)
#: A range's sums of them in its commit record (absent: none counted).
TOKEN_KEYS = ("tokens_in", "tokens_out")
# Row ids derived from (file, row): rows per file up to 2**40, files up to 2**23.
ROW_ID_FILE_SHIFT = 40
