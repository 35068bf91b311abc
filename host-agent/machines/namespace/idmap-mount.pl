#!/usr/bin/perl
# Makes an idmapped, read-only bind mount: idmap-mount.pl SOURCE TARGET HOST_ID COUNT
#
# Files owned by id N under SOURCE appear under TARGET as owned by HOST_ID + N (N < COUNT), so a
# machine whose root is mapped to HOST_ID sees the shared base as its own, and the base on disk stays
# owned by the host's root. Debian 12's mount(8) has no X-mount.idmap (util-linux 2.39), hence this
# helper; it uses the kernel's mount API (Linux >= 5.12) through perl's syscall and nothing else.
# Perl, not Python: perl-base is on every Debian, and it starts in ~2 ms where python3 with ctypes
# took 25-100 ms of every machine's start.
use strict;
use warnings;

my ($SYS_OPEN_TREE, $SYS_MOVE_MOUNT, $SYS_MOUNT_SETATTR) = (428, 429, 442);    # x86_64 and aarch64 alike
my %SYS_UNSHARE = (x86_64 => 272, aarch64 => 97);
my ($OPEN_TREE_CLONE, $OPEN_TREE_CLOEXEC, $AT_RECURSIVE) = (1, 0o2000000, 0x8000);
my ($AT_EMPTY_PATH, $AT_FDCWD, $MOVE_MOUNT_F_EMPTY_PATH) = (0x1000, -100, 4);
my ($MOUNT_ATTR_RDONLY, $MOUNT_ATTR_NODEV, $MOUNT_ATTR_IDMAP) = (0x1, 0x4, 0x100000);
my $CLONE_NEWUSER = 0x10000000;

if (@ARGV != 4) {
    print STDERR "usage: idmap-mount.pl SOURCE TARGET HOST_ID COUNT\n";
    exit 1;
}
my ($source, $target, $host_id, $count) = @ARGV;
# The machine's architecture (no POSIX module: loading it took 6 ms of the 8 this helper costs).
my $arch_file;
my $arch = open($arch_file, "<", "/proc/sys/kernel/arch") ? <$arch_file> : `uname -m`;
chomp $arch;
my $sys_unshare = $SYS_UNSHARE{$arch};
if (!defined $sys_unshare) {
    print STDERR "idmap-mount: unknown architecture $arch\n";
    exit 1;
}

# A child process holds a user namespace with the mapping; its namespace file is what
# mount_setattr takes. The child waits on a pipe and exits when this process is done.
pipe(my $read_end, my $write_end) or die "idmap-mount: pipe: $!\n";
my $child = fork;
die "idmap-mount: fork: $!\n" unless defined $child;
if ($child == 0) {
    close $write_end;
    exit 1 if syscall($sys_unshare, $CLONE_NEWUSER) != 0;
    sysread $read_end, my $byte, 1;
    exit 0;
}
close $read_end;

my $done = eval {
    my $own = readlink "/proc/self/ns/user";
    my $deadline = time + 5;
    for (;;) {
        my $theirs = readlink "/proc/$child/ns/user";
        die "the mapping process ended before it made its user namespace\n" unless defined $theirs;
        last if $theirs ne $own;
        die "the mapping process did not make its user namespace\n" if time > $deadline;
        select undef, undef, undef, 0.0002;
    }
    for my $name ("uid_map", "gid_map") {
        open my $map, ">", "/proc/$child/$name" or die "$name: $!\n";
        # One write, as the kernel requires.
        defined syswrite $map, "0 $host_id $count\n" or die "$name: $!\n";
        close $map or die "$name: $!\n";
    }
    open my $userns, "<", "/proc/$child/ns/user" or die "the mapping's namespace: $!\n";
    my ($from, $to, $empty) = ("$source", "$target", "");
    my $tree = syscall($SYS_OPEN_TREE, $AT_FDCWD, $from, $OPEN_TREE_CLONE | $OPEN_TREE_CLOEXEC | $AT_RECURSIVE);
    die "open_tree $source: $!\n" if $tree < 0;
    # struct mount_attr { u64 attr_set, attr_clr, propagation, userns_fd }
    my $attr = pack "Q4", $MOUNT_ATTR_IDMAP | $MOUNT_ATTR_RDONLY | $MOUNT_ATTR_NODEV, 0, 0, fileno $userns;
    syscall($SYS_MOUNT_SETATTR, $tree, $empty, $AT_EMPTY_PATH | $AT_RECURSIVE, $attr, length $attr) == 0
      or die "mount_setattr: $!\n";
    syscall($SYS_MOVE_MOUNT, $tree, $empty, $AT_FDCWD, $to, $MOVE_MOUNT_F_EMPTY_PATH) == 0
      or die "move_mount $target: $!\n";
    1;
};
my $error = $@;
close $write_end;
waitpid $child, 0;
if (!$done) {
    print STDERR "idmap-mount: $error";
    exit 1;
}
