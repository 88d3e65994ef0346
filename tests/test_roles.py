"""`fsmc roles` (issue 23, item 6): the writer role's name and the statements that
provision an installation, printed before anything is installed, so a host where the
owner may not create roles (or Terraform, Ansible) can make them ahead; the install
then goes through as that owner, and the application runs on the printed grants."""

from __future__ import annotations

import subprocess
import sys
import uuid
from typing import Any

import psycopg
import pytest
from psycopg import sql

from fsmc.targets.postgres.build import build, emit
from fsmc.targets.postgres.names import _QUOTED_KEYWORDS, quote_ident, writer_role
from tests.conftest import SPECS
from tests.pg_scratch import machine_of

NAMES = ["app", "public", "user", "Order", "my-schema", "data", 'a"b', "_x1", "ünï", "1abc", "select"]


def test_quote_ident_and_the_writers_name_are_the_servers(pg_dsn: str) -> None:
    with psycopg.connect(pg_dsn) as conn:
        keywords = {r[0] for r in conn.execute("SELECT word FROM pg_get_keywords() WHERE catcode <> 'U'")}
        assert keywords == _QUOTED_KEYWORDS
        for name in NAMES:
            assert conn.execute("SELECT quote_ident(%s)", (name,)).fetchone() == (quote_ident(name),), name
            # install.sql.j2's prepare, as SQL computes it, for a database and schema named so
            want = conn.execute(
                "WITH RECURSIVE cut(h) AS (SELECT %s::text || '_' || 'job' UNION ALL"
                " SELECT left(h, -1) FROM cut WHERE octet_length(h) > 40)"
                " SELECT (SELECT h FROM cut WHERE octet_length(h) <= 40 LIMIT 1) || '_writer_' ||"
                " left(encode(sha256(convert_to(format('%%I.%%I.%%I', %s::text, %s::text, 'job'), 'UTF8')), 'hex'), 10)",
                (name, name, name)).fetchone()  # fmt: skip
            assert want == (writer_role("job", name, name),), name


def test_the_printed_roles_let_an_owner_without_createrole_install_and_an_app_run(pg_dsn: str) -> None:
    tag = uuid.uuid4().hex[:10]
    schema, owner, app = f"fsmc_roles_{tag}", f"fsmc_owner_{tag}", f"fsmc_app_{tag}"
    database = psycopg.connect(pg_dsn).info.dbname
    ran = subprocess.run([sys.executable, "-m", "fsmc", "roles", str(SPECS / "job.yaml"), "--database", database,
                          "--schema", schema, "--owner", owner, "--app", app],
                         capture_output=True, text=True, check=False)  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    before, after = ran.stdout.split("-- 2. ")
    writer = writer_role("job", database, schema)
    assert f"CREATE ROLE {writer} NOLOGIN;" in before
    with psycopg.connect(pg_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN NOCREATEROLE").format(sql.Identifier(owner)))
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(app)))
        admin.execute(sql.SQL("CREATE SCHEMA {} AUTHORIZATION {}").format(sql.Identifier(schema), sql.Identifier(owner)))
    try:
        with psycopg.connect(pg_dsn, autocommit=True) as admin:
            admin.execute(before.encode())  # step 1, as the administrator
        with psycopg.connect(pg_dsn, user=owner, options=f"-c search_path={schema}") as conn:
            conn.execute(emit(build(machine_of("job"))).encode())  # refused, were the writer's name another
            conn.execute(after.split("\n", 1)[1].encode())  # step 3: the application's grants
            conn.commit()
            made = conn.execute(f"SELECT {schema}.job_fsmc_writer()".encode()).fetchone()
            assert made == (writer,)
        with psycopg.connect(pg_dsn, user=app) as conn:
            row: Any = conn.execute(f"INSERT INTO {schema}.jobs DEFAULT VALUES RETURNING id".encode()).fetchone()
            moved = conn.execute(f"SELECT {schema}.job_apply(%s, 'claim', 0, 'w')".encode(), (row[0],)).fetchone()
            assert moved == (1,)
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(f"UPDATE {schema}.jobs SET entered_at = now()".encode())
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
            for role in (writer, app, owner):
                admin.execute(sql.SQL("DROP OWNED BY {r}; DROP ROLE {r}").format(r=sql.Identifier(role)))
