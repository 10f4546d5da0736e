"""The statements of a call's hot path, with named parameters, the same on PostgreSQL and SQLite.

Both have ON CONFLICT and RETURNING. Only PostgreSQL has data-modifying WITH, in which the
backend seam (dispatch/store/backends.py) joins some of them into one statement.
"""

from __future__ import annotations

# The first call of a session binds it to its customer, every other counts a step. No row comes
# back when the session is bound to another customer. A twin of a first call waits on the other's
# insert, then counts its own step. `counted` is what the call counts: 1, or for a read of a held
# call's status (WATCHED) 0 while that call waits.
_STEP = """
    INSERT INTO dispatch_session AS session
        (agent_id, session_id, customer_id, steps, created_at, last_call_at)
    VALUES (%(agent_id)s, %(session_id)s, %(customer_id)s, {counted}, %(now)s, %(now)s)
    ON CONFLICT (agent_id, session_id) DO UPDATE
        SET steps = session.steps + {counted}, last_call_at = excluded.last_call_at
        WHERE session.customer_id = excluded.customer_id
    RETURNING steps, {counted} AS counted
"""

# A read of a held call's status (ToolSpec.watches) counts nothing while the confirmation it
# names is this agent's and this customer's and waits for a human (pending, not expired:
# dispatch.pipeline.state.watch_is_free); any other counts 1. A lookup on the primary key, read
# in the statement's own snapshot wherever the statement names it. (The customer is cast so that
# PostgreSQL deduces one type for the parameter the session's row takes too.)
_WATCH_COUNTED = """(CASE WHEN EXISTS (
        SELECT 1 FROM dispatch_confirmation
        WHERE id = %(watched)s AND agent_id = %(agent_id)s
            AND customer_id = CAST(%(customer_id)s AS varchar(64))
            AND status = 'pending' AND expires_at > %(now)s
    ) THEN 0 ELSE 1 END)"""

STEP = _STEP.format(counted="1")
WATCHED_STEP = _STEP.format(counted=_WATCH_COUNTED)

# The head of the session's audit chain (dispatch/pipeline/audit_chain.py): its last record, found
# backwards on the chain's unique index. No row: the chain has no record yet.
HEAD = """
    SELECT chain_seq AS audit_seq, chain_hash AS audit_head FROM dispatch_auditrecord
    WHERE agent_id = %(agent_id)s AND session_id = %(session_id)s AND chain_seq IS NOT NULL
    ORDER BY chain_seq DESC LIMIT 1
"""

# A key seen for the first time is inserted in the status its decision gives it (a write's is in
# progress at once, so that the call that inserted it owns it); a known key is counted, and its
# record comes back for the decision. count is 0 when a waiting call reads the key again.
CLAIM = """
    INSERT INTO dispatch_idempotencyrecord AS record
        (key, agent_id, session_id, tool, status, attempts, confirmation_id, created_at, updated_at)
    VALUES (%(key)s, %(agent_id)s, %(session_id)s, %(tool)s, %(new_status)s, %(count)s, '',
        %(now)s, %(now)s)
    ON CONFLICT (key) DO UPDATE
        SET attempts = record.attempts + %(count)s, updated_at = excluded.updated_at
    RETURNING status AS key_status, attempts AS key_attempts, result AS key_result,
        confirmation_id AS key_confirmation_id,
        confirmation_expires_at AS key_confirmation_expires_at,
        created_at = %(now)s AS key_fresh
"""

# Compare-and-set: of two twins that read the same status, only one moves the key on.
MOVE_KEY = """
    UPDATE dispatch_idempotencyrecord SET status = %(new_status)s
    WHERE key = %(key)s AND status = %(status)s
"""

# A remote write's key in progress whose lease ran out (its process died during the effect):
# taken over by the one identical call that moves it first; the taker's effect sets a new lease.
TAKE_OVER = """
    UPDATE dispatch_idempotencyrecord SET lease_until = NULL
    WHERE key = %(key)s AND status = 'in_progress' AND lease_until < %(now)s
"""

# A key settled is held by no process any more: a remote write's lease ends with it.
SETTLE = """
    UPDATE dispatch_idempotencyrecord
    SET status = %(settled_status)s, result = %(settled_result)s, updated_at = %(settled_at)s,
        lease_until = NULL
    WHERE key = %(settled_key)s
"""

_AUDIT_INTO = """
    INSERT INTO dispatch_auditrecord
        (call_id, at, agent_id, session_id, customer_id, step, tool, raw_arguments, arguments,
        key, ok, code, message, replayed, confirmation_id, policy_version, duration_ms, channel,
        chain_seq, chain_hash, chain_mac)
"""

_AUDIT_VALUES = """%(call_id)s, %(at)s, %(agent_id)s, %(session_id)s, %(customer_id)s, %(step)s,
        %(tool)s, %(raw_arguments)s, %(arguments)s, %(key)s, %(ok)s, %(code)s, %(message)s,
        %(replayed)s, %(confirmation_id)s, %(policy_version)s, %(duration_ms)s, %(channel)s,
        %(chain_seq)s, %(chain_hash)s, %(chain_mac)s"""

# The audit record is the next link of its session's chain, at the place after the head the call
# read: the chain's unique index lets only one record take a place. A record of the same session
# that took it in between (a read's opening commits on its own, and a write waiting on the
# session's row read the head before the other committed) makes this one write nothing: no row,
# and the store links it again after the new head.
_LINK_TAKEN = "ON CONFLICT (agent_id, session_id, chain_seq) DO NOTHING"

AUDIT = f"{_AUDIT_INTO} VALUES ({_AUDIT_VALUES}) {_LINK_TAKEN}"

# The same record where its place taken must fail the statement (a unique violation of the
# chain's constraint, CHAIN_PLACE): a write's last statement, sent with its commit.
AUDIT_OR_FAIL = f"{_AUDIT_INTO} VALUES ({_AUDIT_VALUES})"
CHAIN_PLACE = "audit_chain_place"

# The columns AUDIT writes: a test holds them to the model's, so that a new field fails loudly.
AUDIT_COLUMNS = (
    "call_id",
    "at",
    "agent_id",
    "session_id",
    "customer_id",
    "step",
    "tool",
    "raw_arguments",
    "arguments",
    "key",
    "ok",
    "code",
    "message",
    "replayed",
    "confirmation_id",
    "policy_version",
    "duration_ms",
    "channel",
    "chain_seq",
    "chain_hash",
    "chain_mac",
)

# PostgreSQL: a call opens in one statement. The step is counted; within the budget (or where
# nothing was counted) the key is claimed as CLAIM does, counting the use the step counted, and the
# lookup, if the tool has one, is read ({lookup} is its SELECT). No row: the session is another
# customer's.
#
# Outside a transaction (a read) the statement commits on its own, and it may do so without
# waiting for its WAL to reach the disk: the call's last statement, the audit record, commits
# synchronously, and that flush covers everything written before it, so whatever an agent was
# answered about is durable. Inside a write's transaction the setting stays what it was.
# set_config(..., true) lasts only for the statement's own transaction.
OPEN_POSTGRESQL = """
    WITH commit_mode AS (
        SELECT set_config('synchronous_commit',
            CASE WHEN %(commit_async)s THEN 'off' ELSE current_setting('synchronous_commit') END,
            true)
    ),
    step AS ({step}),
    claimed AS (
        INSERT INTO dispatch_idempotencyrecord AS record
            (key, agent_id, session_id, tool, status, attempts, confirmation_id, created_at,
            updated_at)
        SELECT %(key)s, %(agent_id)s, %(session_id)s, %(tool)s, %(new_status)s, step.counted,
            '', %(now)s, %(now)s
        FROM step WHERE step.steps <= %(step_budget)s OR step.counted = 0
        ON CONFLICT (key) DO UPDATE
            SET attempts = record.attempts + excluded.attempts, updated_at = excluded.updated_at
        RETURNING status AS key_status, attempts AS key_attempts, result AS key_result,
            confirmation_id AS key_confirmation_id,
            confirmation_expires_at AS key_confirmation_expires_at,
            created_at = %(now)s AS key_fresh
    ),
    looked AS (
        SELECT true AS lookup_found, lookup.*
        FROM ({lookup}) AS lookup
        WHERE (SELECT steps <= %(step_budget)s OR counted = 0 FROM step)
    ),
    head AS ({head})
    SELECT step.steps, step.counted, head.audit_seq, head.audit_head, claimed.*, looked.*
    FROM commit_mode, step LEFT JOIN head ON true LEFT JOIN claimed ON true
        LEFT JOIN looked ON true
"""

# PostgreSQL: the opening of a call that claims nothing (refused by stages 1 to 3).
STEP_POSTGRESQL = f"""
    WITH commit_mode AS (
        SELECT set_config('synchronous_commit',
            CASE WHEN %(commit_async)s THEN 'off' ELSE current_setting('synchronous_commit') END,
            true)
    ),
    step AS ({STEP}),
    head AS ({HEAD})
    SELECT step.steps, head.audit_seq, head.audit_head
    FROM commit_mode, step LEFT JOIN head ON true
"""

# A call with no lookup reads nothing in its opening.
NO_LOOKUP = "SELECT 1 AS nothing WHERE false"
