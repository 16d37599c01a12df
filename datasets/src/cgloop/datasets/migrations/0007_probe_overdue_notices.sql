-- Overdue notices (issue 9, loop reaction time). A node agent's probe session with
-- ProbeSpec.overdue_after_ns reports a probe still unanswered after that long as a
-- ProbeRecord with `overdue` set: rtt_ns is then a lower bound, known before the reply comes.
-- The reply (or the loss) follows as a row of its own with the same probe_sequence, so the
-- notices are kept apart by this column: RTT statistics read `NOT overdue` rows (and, as
-- before, `NOT lost`). Older rows are not notices (default false).
--
-- Dropping and re-creating the view is not atomic: run migrations with the sink stopped
-- (`cgloop store migrate` does).

ALTER TABLE cgloop.probe_ingest ADD COLUMN IF NOT EXISTS overdue Bool;
ALTER TABLE cgloop.probe_records ADD COLUMN IF NOT EXISTS overdue Bool DEFAULT false AFTER lost;

DROP VIEW IF EXISTS cgloop.probe_records_mv;
CREATE MATERIALIZED VIEW IF NOT EXISTS cgloop.probe_records_mv TO cgloop.probe_records AS
SELECT
    header_source_id AS source_id,
    header_sequence AS sequence,
    header_schema_version AS schema_version,
    fromUnixTimestamp64Nano(toInt64(header_timestamp_ns), 'UTC') AS time,
    probe_id, method,
    if(length(source_addr) = 4,
       IPv4ToIPv6(reinterpretAsUInt32(reverse(source_addr))),
       CAST(toFixedString(source_addr, 16) AS IPv6)) AS source_addr,
    if(length(target_addr) = 4,
       IPv4ToIPv6(reinterpretAsUInt32(reverse(target_addr))),
       CAST(toFixedString(target_addr, 16) AS IPv6)) AS target_addr,
    source_port, target_port, dscp, ecn, probe_sequence, packet_bytes,
    fromUnixTimestamp64Nano(toInt64(sent_ns), 'UTC') AS sent,
    fromUnixTimestamp64Nano(toInt64(received_ns), 'UTC') AS received,
    rtt_ns, lost, overdue, reply_ttl, forward_delay_ns, reverse_delay_ns, reply_ecn
FROM cgloop.probe_ingest;
