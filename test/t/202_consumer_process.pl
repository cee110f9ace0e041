# The Kafka process's consumer mode, for the inbox: outbox_kafka, as
# installed, started with a socket on fd 0 and spoken to frame by frame as
# the consuming worker would (kafka_wire.h), against the suite's broker.
# test/kafka/consumer_process_check.py does the speaking and the checking:
# every partition read from the start given (earliest, listed positions,
# start_ms), exactly once and in order; FETCH's limits; ASSIGNED's real
# offsets; messages intact (NULL key, value and header value, binary
# bytes, timestamps); watermarks; a missing topic reported once and read
# once created; partitions added later; errors as CONSUME_ERROR; a bad
# property's FAILED; exit status 0 at end of file.  Each check it passes is
# a test here.
use strict;
use warnings;

use OutboxTest;
use File::Basename qw(dirname);
use File::Spec;
use IPC::Run;
use Test::More;

my $pkglibdir = `pg_config --pkglibdir`;
chomp $pkglibdir;
my $exe = "$pkglibdir/outbox_kafka";
ok(-x $exe, "outbox_kafka is installed in $pkglibdir");

my $check = File::Spec->rel2abs(dirname(__FILE__) . '/../kafka/consumer_process_check.py');
my ($out, $err) = ('', '');
my $finished = eval {
	IPC::Run::run([ '/usr/bin/python3', $check, '--exe', $exe, '--brokers', brokers() ],
		'<', \undef, '>', \$out, '2>', \$err, IPC::Run::timeout(120));
};
$err .= "\n$@" if $@;

for my $line (split /\n/, $out)
{
	if ($line =~ /^PASS: (.*)/) { pass($1) }
	elsif ($line =~ /^FAIL: (.*)/) { fail($1) }
	else { note($line) }
}
note("stderr: $err") if $err ne '';
ok($finished, 'consumer_process_check.py passed every check')
  or diag("exit status " . ($? >> 8) . "\n$out\n$err");
done_testing();
