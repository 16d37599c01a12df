from cgloop.datasets.store.sql import split_statements


def test_splits_on_semicolons_outside_quotes_and_comments() -> None:
    script = """
    -- leading comment; with a semicolon
    CREATE DATABASE IF NOT EXISTS a;
    /* block; comment */
    CREATE TABLE a.t (s String DEFAULT 'x;y', `odd;name` UInt8) ENGINE = Memory;
    SELECT "q;uoted", 'it\\'s; fine'
    """
    statements = split_statements(script)
    assert len(statements) == 3
    assert statements[0].endswith("CREATE DATABASE IF NOT EXISTS a")
    assert "'x;y'" in statements[1] and "`odd;name`" in statements[1]
    assert statements[2].startswith('SELECT "q;uoted"')


def test_comment_only_script_has_no_statements() -> None:
    assert split_statements("-- nothing here;\n/* nor; here */\n;;") == []
