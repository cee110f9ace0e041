#!/usr/bin/env python3
"""Run the SQL examples of Markdown files as a user would paste them into psql.

Every ```sql block of each file is run, in order, by its own
`psql -X -q -v ON_ERROR_STOP=1` session (a block starts no later block's
transaction or setting).  The rules the documentation is written to:

- Each file starts in database `postgres` as `postgres` (or --dbname,
  --user); a `\\c db [role]` (or `\\connect`) in a block moves that block and
  the file's later blocks there (`-` keeps the part it stands for).
- `<!-- not run: why -->` on the line before a block's opening fence: the
  block is an illustration, not run.
- A ```text block after an sql block, with nothing but blank lines between,
  is its shown output.  psql's results (stdout) are compared with its lines
  that are not server messages, and psql's server messages (stderr, without
  psql's `psql:<stdin>:N:` prefix) with its lines that are (`ERROR:`,
  `WARNING:`, `NOTICE:`, `INFO:`, `DETAIL:`, `HINT:`), each in order;
  trailing blanks and blank lines at either end do not count.  A block may
  fail only if its shown output has an `ERROR:` line.
- `<!-- also shown output: why -->` on the line before a ```text block
  that follows the shown output of an sql block (prose may come between):
  another output the block may print, such as another PostgreSQL major's
  wording of a message.  The block is ok if its output is any of them.
- `<!-- waits for the worker -->` on the line before a block's fence: the
  block reads what the worker does after a commit; it is run again until
  its output is the shown output, for at most --wait seconds.

Prints one line per block, `ok FILE:LINE` or `not ok FILE:LINE` followed by
what differed; exits 1 if any block was not ok, 2 on a usage error.
"""

import argparse
import difflib
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field

FENCE = re.compile(r'^(\s*)```(\S*)')
NOT_RUN = re.compile(r'^\s*<!--\s*not run:.*-->\s*$')
WAITS = re.compile(r'^\s*<!--\s*waits for the worker\s*-->\s*$')
ALSO_SHOWN = re.compile(r'^\s*<!--\s*also shown output:.*-->\s*$')
CONNECT = re.compile(r'^\s*\\c(?:onnect)?\s+(\S+)(?:\s+(\S+))?')
MESSAGE = re.compile(r'^(ERROR|WARNING|NOTICE|INFO|DETAIL|HINT):')
PSQL_PREFIX = re.compile(r'^psql:[^:]*:\d+: ')


@dataclass
class Example:
    path: str
    line: int                   # of the opening fence, 1-based
    sql: str
    marker: str = ''            # 'not run', 'waits', or ''
    shown: list = field(default_factory=list)
    has_shown: bool = False
    also_shown: list = field(default_factory=list)     # other outputs it may print


def read_blocks(path):
    """Every fenced block of a Markdown file: (line, language, text, marker)."""
    with open(path, encoding='utf-8') as f:
        lines = f.read().split('\n')
    blocks = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, lang = m.group(1), m.group(2)
        before = lines[i - 1] if i > 0 else ''
        marker = ('not run' if NOT_RUN.match(before) else 'waits' if WAITS.match(before)
                  else 'also shown' if ALSO_SHOWN.match(before) else '')
        start = i
        body = []
        i += 1
        while i < len(lines) and not re.match(r'^\s*```\s*$', lines[i]):
            body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i].lstrip())
            i += 1
        blocks.append((start + 1, lang, '\n'.join(body), marker))
        i += 1
    return blocks, lines


def examples_of(path):
    """The sql blocks of a file, each with its shown output if it has one."""
    blocks, lines = read_blocks(path)
    examples = []
    for n, (line, lang, text, marker) in enumerate(blocks):
        if lang != 'sql':
            continue
        ex = Example(path, line, text, marker)
        if n + 1 < len(blocks) and blocks[n + 1][1] == 'text':
            end_of_sql = line + text.count('\n') + 2       # the closing fence's line
            between = lines[end_of_sql:blocks[n + 1][0] - 1]
            if all(not s.strip() for s in between):
                ex.shown = blocks[n + 1][2].split('\n')
                ex.has_shown = True
                for _, other_lang, other, other_marker in blocks[n + 2:]:
                    if other_lang != 'text' or other_marker != 'also shown':
                        break
                    ex.also_shown.append(other.split('\n'))
        examples.append(ex)
    return examples


def trimmed(lines):
    lines = [s.rstrip() for s in lines]
    while lines and not lines[0]:
        lines.pop(0)
    while lines and not lines[-1]:
        lines.pop()
    return lines


def split_shown(shown):
    """The shown output as (results, messages)."""
    results, messages = [], []
    for s in shown:
        (messages if MESSAGE.match(s) else results).append(s)
    return trimmed(results), trimmed(messages)


def run_psql(args, db, user, sql, stop_on_error):
    cmd = [args.psql, '-X', '-q', '-v', 'ON_ERROR_STOP=%d' % stop_on_error,
           '-v', 'SHOW_CONTEXT=never', '-h', args.host, '-p', str(args.port),
           '-U', user, '-d', db, '-f', '-']
    env = dict(os.environ, PGCLIENTENCODING='UTF8', LC_ALL='C.UTF-8', PGTZ='UTC')
    p = subprocess.run(cmd, input=sql, capture_output=True, text=True, env=env, timeout=300)
    stderr = [PSQL_PREFIX.sub('', s) for s in p.stderr.split('\n')]
    return p.returncode, trimmed(p.stdout.split('\n')), trimmed(stderr)


def check(ex, status, out, err):
    """What is wrong with one run of an example, or None: its output is the
    shown output, or one of the others it may print."""
    if not ex.has_shown:
        if status != 0:
            return 'it failed:\n' + '\n'.join(err)
        return None
    problems = [check_shown(shown, status, out, err) for shown in [ex.shown] + ex.also_shown]
    return None if None in problems else problems[0]


def check_shown(shown, status, out, err):
    """What is wrong with one run of an example against one shown output."""
    want_out, want_err = split_shown(shown)
    expects_error = any(s.startswith('ERROR:') for s in want_err)
    if status != 0 and not expects_error:
        return 'it failed:\n' + '\n'.join(err)
    problems = []
    for what, want, got in (('results', want_out, out), ('server messages', want_err, err)):
        if want != got:
            diff = difflib.unified_diff(want, got, 'shown', 'psql printed', lineterm='')
            problems.append('its %s differ from the shown output:\n%s' % (what, '\n'.join(diff)))
    return '\n'.join(problems) or None


def run_example(args, ex, db, user):
    expects_error = any(s.startswith('ERROR:') for s in split_shown(ex.shown)[1])
    deadline = time.monotonic() + (args.wait if ex.marker == 'waits' else 0)
    while True:
        status, out, err = run_psql(args, db, user, ex.sql, 0 if expects_error else 1)
        problem = check(ex, status, out, err)
        if problem is None or time.monotonic() >= deadline:
            return problem
        time.sleep(0.2)


def moved_to(sql, db, user):
    """Where the block's last \\c leaves the session."""
    for s in sql.split('\n'):
        m = CONNECT.match(s)
        if m:
            db = db if m.group(1) == '-' else m.group(1)
            if m.group(2) and m.group(2) != '-':
                user = m.group(2)
    return db, user


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('files', nargs='+')
    ap.add_argument('--host', default=os.environ.get('PGHOST', '/tmp'))
    ap.add_argument('--port', default=os.environ.get('PGPORT', '5432'))
    ap.add_argument('--user', default='postgres')
    ap.add_argument('--dbname', default='postgres')
    ap.add_argument('--psql', default='psql')
    ap.add_argument('--wait', type=float, default=60, help='seconds a waiting block may take')
    ap.add_argument('--list', action='store_true', help='list the examples, run nothing')
    args = ap.parse_args()

    failed = 0
    for path in args.files:
        db, user = args.dbname, args.user
        for ex in examples_of(path):
            where = '%s:%d' % (path, ex.line)
            if args.list:
                print('%-9s %s%s' % (ex.marker or 'run', where, ' (shown output)' if ex.has_shown else ''))
                continue
            if ex.marker == 'not run':
                print('skip %s (not run)' % where)
                continue
            if ex.marker == 'waits' and not ex.has_shown:
                problem = 'it waits for the worker but shows no output to wait for'
            else:
                problem = run_example(args, ex, db, user)
            db, user = moved_to(ex.sql, db, user)
            if problem:
                failed += 1
                print('not ok %s: %s' % (where, problem.replace('\n', '\n    ')))
            else:
                print('ok %s' % where)
            sys.stdout.flush()
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
