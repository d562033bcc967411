"""The internal columns rows carry through the stages, never shown to a predictor.

The range a row belongs to (so the driver knows when a range is complete), the input columns
kept for the output (so a predictor in the style of Ray's guide, which returns only its outputs,
still gets them written beside its results), and, once a stage rejects a row, why.

A stage rejects rows by returning a column ``REJECT_COLUMN`` holding a reason (None for rows it
accepts) and optionally ``REJECT_KIND_COLUMN`` (``INVALID_INPUT`` or ``ENGINE_ERROR``, the
default). Later stages never see rejected rows; they are written to the rejects output.

A stage counts things per row by returning the columns of :data:`COUNTED_COLUMNS`, integers or
None (not counted): a token-based model what each row cost, ``TOKENS_IN_COLUMN`` (prompt tokens)
and ``TOKENS_OUT_COLUMN`` (generated tokens); an embedding model ``TRUNCATED_COLUMN``, 1 for a row
whose text it cut to its maximum length, else 0. Counts of several stages add up. They are summed
per range into its commit record, so an output's totals count each committed row once, whatever
its tries spent.
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
#: 1 for a row whose text a model cut to its maximum length, 0 for one it took whole (null: not counted).
TRUNCATED_COLUMN = "__raybatch_truncated"
#: The counted columns, each with the key of its sum over a range's rows in the write step's file
#: metadata, the range's commit record, the run's summary and the output's status (absent or
#: None there: no row of it was counted).
COUNTED_COLUMNS = {
    TOKENS_IN_COLUMN: "tokens_in",
    TOKENS_OUT_COLUMN: "tokens_out",
    TRUNCATED_COLUMN: "truncated_rows",
}
COUNT_KEYS = tuple(COUNTED_COLUMNS.values())
#: The token counts' keys.
TOKEN_KEYS = ("tokens_in", "tokens_out")
# Row ids derived from (file, row): rows per file up to 2**40, files up to 2**23.
ROW_ID_FILE_SHIFT = 40
