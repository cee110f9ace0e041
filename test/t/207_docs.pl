# The documentation's examples, run as written: every ```sql block of
# README.md and of each docs/*.md, in the order a reader meets them (the
# README first, then each docs file in the order the README first links to
# it), against a fresh cluster configured as the sandbox is
# (test/sandbox.conf) and a Kafka broker of this test's own, so that no
# earlier test's topic is read.  test/docs/run_examples.py holds the rules
# (illustrations marked `<!-- not run: ... -->`, shown output compared,
# `<!-- waits for the worker -->`); first it is shown to fail a wrong
# example, so that a pass means the examples are right.
use strict;
use warnings;

use File::Basename qw(dirname);
use Cwd qw(abs_path);
use OutboxTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $top = abs_path(dirname(__FILE__) . '/../..');
my $runner = "$top/test/docs/run_examples.py";

# A broker of its own, on KAFKA_PORT + 300.
my $port = ($ENV{KAFKA_PORT} // 19092) + 300;
$ENV{KAFKA_PORT} = $port;
$ENV{KAFKA_DIR} = PostgreSQL::Test::Utils::tempdir() . '/kafka';
$ENV{OUTBOX_KAFKA_BROKERS} = "127.0.0.1:$port";
END { broker_ctl('stop') if $ENV{KAFKA_DIR} && -e "$ENV{KAFKA_DIR}/broker.pid"; }
broker_ctl('start');

my $node = PostgreSQL::Test::Cluster->new('docs');
$node->init;
$node->append_conf('postgresql.conf',
	slurp_file("$top/test/sandbox.conf") . "outbox.brokers = '127.0.0.1:$port'\n");
$node->start;

# Runs the examples of the files given; returns the exit status and the
# runner's lines.
sub run_examples
{
	my (@files) = @_;
	my ($stdout, $stderr);
	my $ok = IPC::Run::run(
		[ 'python3', $runner, '--host', $node->host, '--port', $node->port, @files ],
		'>', \$stdout, '2>', \$stderr);
	diag($stderr) if $stderr;
	return ($ok ? 0 : $? >> 8, $stdout);
}

# The runner fails what is wrong, and only that.
my $wrong = PostgreSQL::Test::Utils::tempdir() . '/wrong.md';
open(my $fh, '>', $wrong) or die "cannot write $wrong: $!";
print $fh <<'MD';
```sql
SELECT 1 AS one;
```

```text
 one
-----
   1
(1 row)
```

```sql
SELECT 2 AS two;
```

```text
 two
-----
   3
(1 row)
```

```sql
SELECT no_such_function();
```

```sql
SELECT 1/0;
```

```text
ERROR:  division by zero
```

```sql
SELECT 4 AS four;
```

```text
 four
------
    5
(1 row)
```

Or:

<!-- also shown output: another major's -->
```text
 four
------
    4
(1 row)
```

```sql
SELECT 6 AS six;
```

```text
 six
-----
   7
(1 row)
```

<!-- also shown output: another major's -->
```text
 six
-----
   8
(1 row)
```
MD
close $fh;
my ($status, $out) = run_examples($wrong);
is($status, 1, 'the runner fails a file with wrong examples');
like($out, qr/^ok \S+wrong\.md:1$/m, 'a right shown output passes');
like($out, qr/^not ok \S+wrong\.md:12: its results differ/m, 'a wrong shown output fails');
like($out, qr/^not ok \S+wrong\.md:23: it failed:\n\s+ERROR:  function no_such_function/m,
	'a statement that fails fails the example');
like($out, qr/^ok \S+wrong\.md:27$/m, 'an error that is shown passes');
like($out, qr/^ok \S+wrong\.md:35$/m, 'an output that is one of those shown passes');
like($out, qr/^not ok \S+wrong\.md:56: its results differ/m, 'an output that is none of those shown fails');

# The reader's order: the README, then each docs file as the README first
# links to it.  A docs file the README does not link to is not found.
my $readme = slurp_file("$top/README.md");
my @linked;
while ($readme =~ m{\]\((?:\./)?(docs/[\w.-]+\.md)(?:#[^)]*)?\)}g)
{
	push @linked, $1 unless grep { $_ eq $1 } @linked;
}
my @docs = map { s{^\Q$top\E/}{}r } glob("$top/docs/*.md");
for my $doc (@docs)
{
	ok((grep { $_ eq $doc } @linked), "README.md links to $doc");
}
ok(-f "$top/$_", "README.md links to $_, which exists") for @linked;

($status, $out) = run_examples(map { "$top/$_" } 'README.md', @linked);
for my $line (split /\n(?=\S)/, $out)
{
	my ($verdict, $where) = $line =~ /^(ok|not ok|skip) (\S+?):?(?:\s|$)/ or next;
	next if $verdict eq 'skip';
	$where =~ s{^\Q$top\E/}{};
	ok($verdict eq 'ok', "example at $where") or diag($line);
}
like($out, qr/^ok /m, 'the documentation has examples that ran');
is($status, 0, 'every example of the documentation runs as written');

$node->stop;
done_testing();
