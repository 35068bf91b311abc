#!/usr/bin/perl
# The process that starts host tools for `exec.ts`. A tool started by the host agent would be
# forked from it, copying the page tables of its hundreds of MiB (10-20 ms a tool); forked from a
# node helper, ~1.7 ms of CPU a tool; from this perl program (~5 MiB, perl-base only), ~0.9 ms.
#
# Messages both ways are frames: a line `N LEN1 ... LENN` and then the N fields' bytes, back to
# back. A request is `ID LOG INPUT ENV CMD ARG...`:
#   LOG    empty: the tool's stdout and stderr are collected and answered; else a file its output
#          is appended to (stdin /dev/null), and the answer comes at its exit, whatever still
#          holds the file;
#   INPUT  the tool's stdin (pipe mode);
#   ENV    empty: this process's environment; else `=` and the exact environment as NUL-separated
#          NAME=VALUE entries.
# The answer is `ID exit CODE STDOUT STDERR` (CODE empty when a signal ended it) once the tool
# exited and its output ended, or `ID error MESSAGE` when it could not start. It exits when its
# parent goes (stdin ends); tools it started run on.
use strict;
use warnings;
use Errno ();
use Fcntl qw(F_GETFL F_SETFL O_NONBLOCK);
use POSIX qw(WNOHANG);

$SIG{PIPE} = 'IGNORE';    # a tool that exits before it read its input
pipe(my $wake_r, my $wake_w) or die "pipe: $!";
nonblocking($_) for $wake_r, $wake_w;
$SIG{CHLD} = sub { syswrite($wake_w, "x") };

my %tools;     # pid => the tool's state
my %reading;   # fileno => [pid, which] of a tool's stdout/stderr
my %writing;   # fileno => pid of a tool whose stdin has input left
my $in = '';

sub nonblocking {
    my ($fh) = @_;
    my $flags = fcntl($fh, F_GETFL, 0) or die "fcntl: $!";
    fcntl($fh, F_SETFL, $flags | O_NONBLOCK) or die "fcntl: $!";
}

sub frame { join(' ', scalar(@_), map { length } @_) . "\n" . join('', @_) }

sub answer {
    my $out = frame(@_);
    while (length $out) {
        my $n = syswrite(STDOUT, $out);
        if (!defined $n) { next if $!{EINTR}; exit 0 }    # the parent is gone
        substr($out, 0, $n, '');
    }
}

sub errno_name {
    my ($errno) = @_;
    local $! = $errno;
    for my $name (keys %!) { return $name if $!{$name} }
    return "errno $errno";
}

sub start {
    my ($id, $log, $input, $env, $cmd, @args) = @_;
    my ($logfh, $out_r, $out_w, $err_r, $err_w, $in_r, $in_w);
    if ($log ne '') {
        open($logfh, '>>', $log) or return answer($id, 'error', "$log: $!");
    } else {
        pipe($out_r, $out_w) and pipe($err_r, $err_w) and pipe($in_r, $in_w)
            or return answer($id, 'error', "pipe: $!");
    }
    # Close-on-exec (perl's default above fd 2): empty at a successful exec, the errno otherwise.
    pipe(my $status_r, my $status_w) or return answer($id, 'error', "pipe: $!");
    my $pid = fork;
    return answer($id, 'error', "spawn $cmd " . errno_name($! + 0)) unless defined $pid;
    if ($pid == 0) {
        $SIG{PIPE} = 'DEFAULT';
        $SIG{CHLD} = 'DEFAULT';
        if ($logfh) {
            open(STDIN, '<', '/dev/null');
            open(STDOUT, '>&', $logfh);
            open(STDERR, '>&', $logfh);
        } else {
            open(STDIN, '<&', $in_r);
            open(STDOUT, '>&', $out_w);
            open(STDERR, '>&', $err_w);
        }
        if ($env ne '') {
            %ENV = ();
            for my $entry (split /\0/, substr($env, 1)) {
                my ($name, $value) = split /=/, $entry, 2;
                $ENV{$name} = $value // '' if $name ne '';
            }
        }
        { no warnings 'exec'; exec { $cmd } $cmd, @args }
        syswrite($status_w, $! + 0);
        POSIX::_exit(127);
    }
    close $status_w;
    my $failed = '';
    for (;;) {
        my $n = sysread($status_r, $failed, 64, length $failed);
        next if $n || (!defined $n && $!{EINTR});
        last;
    }
    close $status_r;
    if ($failed ne '') {
        waitpid($pid, 0);
        return answer($id, 'error', "spawn $cmd " . errno_name($failed));
    }
    my $tool = $tools{$pid} = { id => $id, pid => $pid, out => '', err => '', open => 0, log => defined $logfh };
    if ($logfh) {
        close $logfh;
        return;
    }
    close $_ for $out_w, $err_w, $in_r;
    for ([$out_r, 'out'], [$err_r, 'err']) {
        my ($fh, $which) = @$_;
        nonblocking($fh);
        $tool->{"${which}_fh"} = $fh;
        $reading{ fileno $fh } = [$pid, $which];
        $tool->{open}++;
    }
    $tool->{in_fh} = $in_w;
    $tool->{input} = $input;
    nonblocking($in_w);
    feed($pid);
}

# Writes what input is left; closes the tool's stdin once it is all written (or the tool left).
sub feed {
    my ($pid) = @_;
    my $tool = $tools{$pid};
    my $fh = $tool->{in_fh} or return;
    while (length $tool->{input}) {
        my $n = syswrite($fh, $tool->{input});
        if (!defined $n) {
            next if $!{EINTR};
            if ($!{EAGAIN}) { $writing{ fileno $fh } = $pid; return }
            last;    # EPIPE: it reads no more
        }
        substr($tool->{input}, 0, $n, '');
    }
    delete $writing{ fileno $fh };
    close $fh;
    delete $tool->{in_fh};
}

# Answers for a tool that exited and, collecting its output, whose output ended.
sub settle {
    my ($pid) = @_;
    my $tool = $tools{$pid};
    return unless defined $tool->{status} && ($tool->{log} || $tool->{open} == 0);
    if (my $fh = delete $tool->{in_fh}) {
        delete $writing{ fileno $fh };
        close $fh;
    }
    my $status = $tool->{status};
    answer($tool->{id}, 'exit', ($status & 127) ? '' : ($status >> 8), $tool->{out}, $tool->{err});
    delete $tools{$pid};
}

sub requests {
    while ((my $eol = index($in, "\n")) >= 0) {
        my ($count, @lengths) = split / /, substr($in, 0, $eol);
        my $size = 0;
        $size += $_ for @lengths;
        return if length($in) < $eol + 1 + $size;
        my $at = $eol + 1;
        my @fields;
        for my $length (@lengths) {
            push @fields, substr($in, $at, $length);
            $at += $length;
        }
        substr($in, 0, $at, '');
        start(@fields);
    }
}

for (;;) {
    my ($rin, $win) = ('', '');
    vec($rin, fileno(STDIN), 1) = 1;
    vec($rin, fileno($wake_r), 1) = 1;
    vec($rin, $_, 1) = 1 for keys %reading;
    vec($win, $_, 1) = 1 for keys %writing;
    # At most 10 ms while a tool runs: perl runs a signal's handler only after the call it came
    # during, so a tool that ends just before `select` is entered wrote nothing to the wake pipe
    # yet, and `select` with no timeout then waited forever, its `waitpid` never run (a tool run
    # never answered: seen as a `tc` left defunct under a machine's start that hung). With no tool
    # running there is nothing to reap, and the helper sleeps until a request comes.
    my $ready = select(my $rout = $rin, my $wout = $win, undef, %tools ? 0.01 : undef);
    if ($ready < 0) {
        next if $!{EINTR};
        die "select: $!";
    }
    if (vec($rout, fileno($wake_r), 1)) { 1 while sysread($wake_r, my $drained, 4096) }
    while ((my $pid = waitpid(-1, WNOHANG)) > 0) {
        next unless $tools{$pid};
        $tools{$pid}{status} = $?;
        settle($pid);
    }
    for my $fd (keys %writing) { feed($writing{$fd}) if vec($wout, $fd, 1) }
    for my $fd (keys %reading) {
        next unless vec($rout, $fd, 1);
        my ($pid, $which) = @{ $reading{$fd} };
        my $tool = $tools{$pid};
        my $n = sysread($tool->{"${which}_fh"}, $tool->{$which}, 65536, length $tool->{$which});
        next if !defined $n && ($!{EINTR} || $!{EAGAIN});
        next if $n;
        close delete $tool->{"${which}_fh"};
        delete $reading{$fd};
        $tool->{open}--;
        settle($pid);
    }
    if (vec($rout, fileno(STDIN), 1)) {
        my $n = sysread(STDIN, $in, 65536, length $in);
        next if !defined $n && $!{EINTR};
        exit 0 unless $n;    # the parent is gone
        requests();
    }
}
