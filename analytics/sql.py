"""The statements the fills write with, with named parameters, the same on PostgreSQL and SQLite
(both have ON CONFLICT). The tables keep the names they had in dispatch."""

from __future__ import annotations

# What a fill counted in an hour, added to the hour's row.
HOUR_ADD = """
    INSERT INTO dispatch_callrollup AS rollup
        (hour, agent_id, tool, code, calls, replayed, correctable, recovered)
    VALUES (%(hour)s, %(agent_id)s, %(tool)s, %(code)s, %(calls)s, %(replayed)s,
        %(correctable)s, %(recovered)s)
    ON CONFLICT (hour, agent_id, tool, code) DO UPDATE
        SET calls = rollup.calls + excluded.calls,
            replayed = rollup.replayed + excluded.replayed,
            correctable = rollup.correctable + excluded.correctable,
            recovered = rollup.recovered + excluded.recovered
"""

# The same, in its UTC day's row: long ranges read days.
DAY_ADD = """
    INSERT INTO dispatch_callrollupday AS rollup
        (day, agent_id, tool, code, calls, replayed, correctable, recovered)
    VALUES (%(day)s, %(agent_id)s, %(tool)s, %(code)s, %(calls)s, %(replayed)s,
        %(correctable)s, %(recovered)s)
    ON CONFLICT (day, agent_id, tool, code) DO UPDATE
        SET calls = rollup.calls + excluded.calls,
            replayed = rollup.replayed + excluded.replayed,
            correctable = rollup.correctable + excluded.correctable,
            recovered = rollup.recovered + excluded.recovered
"""

# Decisions a fill counted, added to their day's histogram.
DECISIONS_ADD = """
    INSERT INTO dispatch_decisionrollup AS rollup
        (day, agent_id, tool, decided_by, bucket, decisions)
    VALUES (%(day)s, %(agent_id)s, %(tool)s, %(decided_by)s, %(bucket)s, %(decisions)s)
    ON CONFLICT (day, agent_id, tool, decided_by, bucket) DO UPDATE
        SET decisions = rollup.decisions + excluded.decisions
"""

# A fill state for a kind of row that none has counted yet; another fill's is left as it is.
FILL_STATE_ENSURE = """
    INSERT INTO analytics_fillstate (property, last_id, end_time, state, last_modified)
    VALUES (%(property)s, 0, %(now)s, %(done)s, %(now)s)
    ON CONFLICT (property) DO NOTHING
"""
