# What a packager or PGXN gets: META.json as the PGXN Meta Spec 1.0.0
# defines it, agreeing with the control file and the install scripts, and
# the release archive `make dist` makes, which builds against the server
# being tested without a warning under -Wall -Wextra.
use strict;
use warnings;

use File::Basename qw(dirname);
use Cwd qw(abs_path);
use JSON::PP;
use PostgreSQL::Test::Utils;
use Test::More;

my $top = abs_path(dirname(__FILE__) . '/../..');
my $meta = decode_json(slurp_file("$top/META.json"));
my ($default_version) = slurp_file("$top/outbox.control") =~ /^default_version = '([^']+)'/m;

# The spec's required keys, and what each must hold.
for my $key (qw(name abstract version maintainer license provides meta-spec))
{
	ok(defined $meta->{$key}, "META.json has $key");
}
is($meta->{'meta-spec'}{version}, '1.0.0', 'META.json follows the Meta Spec 1.0.0');
like($meta->{version}, qr/^\d+\.\d+\.\d+$/, 'the distribution version is a semantic version');
is($meta->{name}, 'outbox', 'the distribution is outbox');
my $provided = $meta->{provides}{outbox};
is($provided->{version}, $default_version, 'the extension provided is the version the control file installs');
is($meta->{version}, $default_version, 'the distribution has the version of its extension');
ok(-f "$top/$provided->{file}", "the file provided, $provided->{file}, exists");
is($provided->{file}, "sql/outbox--$default_version.sql", 'it is the install script of that version');
like($meta->{license}, qr/^(postgresql|open_source)$/, 'a license the spec names');

# Supported majors: a version range the spec defines, and the same range
# the test command runs.
my $range = $meta->{prereqs}{runtime}{requires}{PostgreSQL};
is($range, '>= 15.0.0, < 20.0.0', 'PostgreSQL 15 to 19, as a version range');
my ($majors) = slurp_file("$top/test/run-tests") =~ /^SUPPORTED_MAJORS=\(([^)]*)\)/m;
is($majors, '15 16 17 18 19', 'the test command runs each major META.json supports');
ok(exists $meta->{prereqs}{runtime}{requires}{plpgsql}, 'plpgsql, which its triggers use, is a prerequisite');

# The release archive: every file git tracks at HEAD, under
# outbox-VERSION/, and nothing else.
my $work = PostgreSQL::Test::Utils::tempdir();
# The tests run as another user than the clone's owner (and a worktree's
# git directory is elsewhere): git is to trust the tree anyway.
@ENV{qw(GIT_CONFIG_COUNT GIT_CONFIG_KEY_0 GIT_CONFIG_VALUE_0)} = (1, 'safe.directory', '*');
my ($stdout, $stderr);
my $made = IPC::Run::run([ 'make', '-s', '-C', $top, 'dist' ], '>', \$stdout, '2>', \$stderr);
ok($made, 'make dist succeeds') or diag($stderr);
my $archive = "$top/outbox-$default_version.zip";
ok(-s $archive, "make dist makes outbox-$default_version.zip");
IPC::Run::run([ '/usr/bin/python3', '-m', 'zipfile', '-e', $archive, $work ])
  or BAIL_OUT("cannot unpack $archive");
unlink $archive;
my $tree = "$work/outbox-$default_version";
IPC::Run::run([ 'git', '-C', $top, 'ls-tree', '-r', '--name-only', 'HEAD' ], '>', \$stdout)
  or BAIL_OUT('git ls-tree failed');
my @tracked = sort split /\n/, $stdout;
IPC::Run::run([ 'find', '.', '-type', 'f' ], '>', \$stdout, init => sub { chdir $tree });
my @archived = sort map { s{^\./}{}r } split /\n/, $stdout;
is_deeply(\@archived, \@tracked, 'the archive holds the files git tracks, and only those');

# Built from the archive, against the server under test (pg_config in PATH).
my $built = IPC::Run::run([ 'make', '-C', $tree, 'PG_CONFIG=pg_config' ], '>', \$stdout, '2>&1');
ok($built, 'the archive builds') or diag($stdout);
my @warnings = grep { /warning:/ } split /\n/, $stdout;
is(scalar(@warnings), 0, 'with no warning under -Wall -Wextra on ' . `pg_config --version`)
  or diag(join("\n", @warnings));
ok(-f "$tree/outbox.so" && -x "$tree/src/outbox_kafka", 'the module and its Kafka process are built');

# Against the librdkafka pkg-config finds (PKG_CONFIG_PATH: another build,
# found at run time by the rpath the Makefile adds), else the system's.
my ($libdir) = `pkg-config --variable=libdir rdkafka` =~ /^(\S+)/;
for my $program ("$tree/outbox.so", "$tree/src/outbox_kafka")
{
	my ($loaded) = `ldd $program` =~ /librdkafka\.so\.1 => (\S+)/;
	is(abs_path($loaded // ''), abs_path("$libdir/librdkafka.so.1"),
		"$program loads the librdkafka of $libdir");
}

done_testing();
