-- The database every cgloop table lives in. Tables arrive with the trace-datasets issue.
CREATE DATABASE IF NOT EXISTS cgloop;
