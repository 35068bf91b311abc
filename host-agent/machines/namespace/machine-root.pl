#!/usr/bin/perl
# Mounts a machine's root and has crun make and start its container, in a mount namespace of its
# own whose mounts are all private (what `unshare --mount --propagation private` makes, done here:
# that program's start cost every machine 2-3 ms of CPU), so nothing mounted here reaches the host:
#
#   machine-root.pl DIR TEMPLATE BASE HOST_ID COUNT CRUN_ROOT ID
#
# In DIR (the machine's folder; relative paths from here on, so the guest's mountinfo names no host
# folder): hides the cgroup v2 part of a hybrid layout (crun refuses one whose v2 part holds
# controllers; machines use v1); makes the machine's disk image `disk.img`, a sparse copy of
# TEMPLATE (an empty ext4 of the machine's disk size: only its written blocks are copied, and the
# rest stays a hole); attaches it to a free loop device, named in the file `loop` (cleared by the
# kernel when nothing holds it any more: this process, if it fails before the mount, or the mount,
# when the machine's last process is gone); mounts it on `disk` (ext4; its inode tables are not
# zeroed in the background, `noinit_itable`: the image starts sparse, so they read as zeros
# already); moves the machine's first files (the folder `seed`, made by the driver, owned by
# HOST_ID) onto it; shows BASE on `lower` through an idmapped, read-only bind mount; mounts the
# overlay `root` (lower `lower`, upper `disk/upper`); then becomes `crun --root CRUN_ROOT run
# --detach` (one crun where `create` and then `start` took two, at ~7 ms of CPU each to load and
# parse), run from the sealed copy of crun the tool runner put on descriptor 3 through the link
# DIR/crun (a process is named after the file it was run as: `3`, run as `/proc/self/fd/3`). The
# container keeps the mounts alive (the overlay holds its own copies of `lower` and `disk`); this
# namespace, with its `lower` and `disk`, ends with crun, and the container's copies of them go with
# its old root, which crun detaches (a detach here cost an RCU grace period each, ~2.5 ms).
#
# The idmapped mount: files owned by id N under BASE appear under `lower` as owned by HOST_ID + N
# (N < COUNT), so a machine whose root is mapped to HOST_ID sees the shared base as its own, and the
# base on disk stays owned by the host's root. Debian 12's mount(8) has no X-mount.idmap
# (util-linux 2.39), hence the kernel's mount API (Linux >= 5.12) through perl's syscall.
#
# One program for all of it: a shell running mount, umount and a mount helper took seven programs'
# starts of every machine's, and losetup one more. Perl, not Python: perl-base is on every Debian
# and starts in ~2 ms. Only `strict` is loaded: `warnings` and `Errno` took 3 ms of CPU more on
# every machine's start (an error is known by its number; a test compiles it with `perl -wc`).
use strict;

my ($ENXIO, $EBUSY) = (6, 16);    # x86_64 and aarch64 alike
my ($O_WRONLY, $O_CREAT, $O_EXCL) = (1, 0o100, 0o200);    # the same
my ($SEEK_SET, $SEEK_DATA, $SEEK_HOLE) = (0, 3, 4);

# x86_64 and aarch64: open_tree, move_mount and mount_setattr are alike; the older calls are not.
my ($SYS_OPEN_TREE, $SYS_MOVE_MOUNT, $SYS_MOUNT_SETATTR) = (428, 429, 442);
my %SYS = (
    x86_64  => { unshare => 272, mount => 165, umount2 => 166, exit_group => 231 },
    aarch64 => { unshare => 97,  mount => 40,  umount2 => 39,  exit_group => 94 },
);
my ($OPEN_TREE_CLONE, $OPEN_TREE_CLOEXEC, $AT_RECURSIVE) = (1, 0o2000000, 0x8000);
my ($AT_EMPTY_PATH, $AT_FDCWD, $MOVE_MOUNT_F_EMPTY_PATH) = (0x1000, -100, 4);
my ($MOUNT_ATTR_RDONLY, $MOUNT_ATTR_NODEV, $MOUNT_ATTR_IDMAP) = (0x1, 0x4, 0x100000);
my ($MS_NOSUID, $MS_NODEV, $MS_REC, $MS_PRIVATE, $MNT_DETACH) = (2, 4, 0x4000, 0x40000, 2);
my ($CLONE_NEWNS, $CLONE_NEWUSER) = (0x20000, 0x10000000);
my ($LOOP_CTL_GET_FREE, $LOOP_CONFIGURE, $LO_FLAGS_AUTOCLEAR) = (0x4C82, 0x4C0A, 4);

sub fail {
    print STDERR "machine-root: @_\n";
    exit 1;
}

fail("usage: machine-root.pl DIR TEMPLATE BASE HOST_ID COUNT CRUN_ROOT ID") if @ARGV != 7;
my ($dir, $template, $base, $host_id, $count, $crun_root, $id) = @ARGV;
# The machine's architecture (no POSIX module: loading it took 6 ms).
my $arch_file;
my $arch = open($arch_file, "<", "/proc/sys/kernel/arch") ? <$arch_file> : `uname -m`;
chomp $arch;
my $sys = $SYS{$arch} // fail("unknown architecture $arch");

# Strings are handed to syscall as pointers to their bytes: each from a variable of its own.
sub mount_fs {
    my ($source, $target, $type, $flags, $data) = @_;
    my ($s, $t, $y, $d) = ("$source", "$target", "$type", "$data");
    syscall($sys->{mount}, $s, $t, $y, $flags, $d) == 0 or fail("mount $target: $!");
}

# Detaches what is mounted on TARGET, if anything is.
sub detach_any {
    my $t = "$_[0]";
    syscall($sys->{umount2}, $t, $MNT_DETACH);
}

sub idmapped {
    my ($source, $target) = @_;
    # A child process holds a user namespace with the mapping; its namespace file is what
    # mount_setattr takes. The child waits on a pipe and exits when this process is done, at once
    # (exit_group: perl's own exit frees what it holds, each page of which the fork had shared,
    # ~3 ms this process waited for).
    pipe(my $read_end, my $write_end) or fail("pipe: $!");
    my $child = fork;
    fail("fork: $!") unless defined $child;
    if ($child == 0) {
        close $write_end;
        syscall($sys->{exit_group}, 1) if syscall($sys->{unshare}, $CLONE_NEWUSER) != 0;
        sysread $read_end, my $byte, 1;
        syscall($sys->{exit_group}, 0);
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
    fail("idmapped mount: $error") unless $done;
}

# A new file TO of FROM's size holding FROM's data, FROM's holes left holes (an empty filesystem's
# image is almost all hole).
sub copy_sparse {
    my ($from, $to) = @_;
    open my $in, "<", $from or fail("$from: $!");
    sysopen my $out, $to, $O_WRONLY | $O_CREAT | $O_EXCL, 0600 or fail("$to: $!");
    truncate $out, -s $in or fail("size $to: $!");
    my $at = 0;
    for (;;) {
        my $data = sysseek $in, $at, $SEEK_DATA;
        unless (defined $data) {
            last if $! + 0 == $ENXIO;    # no data past $at
            fail("$from: $!");
        }
        my $hole = sysseek($in, $data, $SEEK_HOLE) // fail("$from: $!");
        (sysseek($in, $data, $SEEK_SET) && sysseek($out, $data, $SEEK_SET)) or fail("seek: $!");
        for (my $left = $hole - $data; $left > 0;) {
            my $n = sysread $in, my $bytes, $left < 1048576 ? $left : 1048576;
            fail("read $from: " . (defined $n ? "ends early" : $!)) unless $n;
            (syswrite($out, $bytes) // -1) == $n or fail("write $to: $!");
            $left -= $n;
        }
        $at = $hole;
    }
    close $out or fail("$to: $!");
}

# Moves the contents of folder FROM into folder TO, each entry's owner and mode kept (folders and
# files only: what the driver writes there), and removes FROM.
sub move_tree {
    my ($from, $to) = @_;
    opendir my $listing, $from or fail("$from: $!");
    for my $name (grep { $_ ne "." && $_ ne ".." } readdir $listing) {
        my ($source, $target) = ("$from/$name", "$to/$name");
        my @st = lstat $source or fail("$source: $!");
        if (-d _) {
            mkdir $target, 0700 or fail("mkdir $target: $!");
            move_tree($source, $target);
        } elsif (-f _) {
            open my $in, "<", $source or fail("$source: $!");
            my $bytes = do { local $/; <$in> } // "";
            sysopen my $out, $target, $O_WRONLY | $O_CREAT | $O_EXCL, 0600 or fail("$target: $!");
            (syswrite($out, $bytes) // -1) == length $bytes or fail("write $target: $!");
            close $out or fail("write $target: $!");
            unlink $source or fail("rm $source: $!");
        } else {
            fail("$source: neither a folder nor a file");
        }
        chown $st[4], $st[5], $target or fail("chown $target: $!");
        chmod $st[2] & 07777, $target or fail("chmod $target: $!");
    }
    closedir $listing;
    rmdir $from or fail("rmdir $from: $!");
}

# A free loop device with IMAGE behind it, cleared when its last holder closes it (losetup did this
# in a tool run of its own). A device another process takes between the two calls is busy: the
# next free one is asked for.
sub attach {
    my ($file) = @_;
    open my $control, "+<", "/dev/loop-control" or fail("/dev/loop-control: $!");
    open my $backing, "+<", $file or fail("$file: $!");
    for (1 .. 100) {
        my $n = ioctl($control, $LOOP_CTL_GET_FREE, 0) // fail("a free loop device: $!");
        my $dev = "/dev/loop" . ($n + 0);
        open my $loop, "+<", $dev or fail("$dev: $!");
        # struct loop_config { u32 fd, block_size; struct loop_info64 info; u64 reserved[8] },
        # the info zero but for lo_flags (after five u64 and three u32).
        my $config = pack "L L Q5 L3 L x64 x64 x32 Q2 x64", fileno $backing, 0, 0, 0, 0, 0, 0, 0, 0, 0,
          $LO_FLAGS_AUTOCLEAR, 0, 0;
        return ($loop, $dev) if ioctl($loop, $LOOP_CONFIGURE, $config);
        fail("attach $dev: $!") unless $! + 0 == $EBUSY;
    }
    fail("no loop device stayed free");
}

# The mount namespace, and every mount in it private: none of what follows propagates to the host's.
syscall($sys->{unshare}, $CLONE_NEWNS) == 0 or fail("unshare the mount namespace: $!");
mount_fs("none", "/", "", $MS_REC | $MS_PRIVATE, "");
chdir $dir or fail("cd $dir: $!");
detach_any("/sys/fs/cgroup/unified");
copy_sparse($template, "disk.img");
my ($loop_fh, $loop) = attach("disk.img");
open my $named, ">", "loop" or fail("loop: $!");
print $named "$loop\n";
close $named or fail("loop: $!");
mount_fs($loop, "disk", "ext4", $MS_NOSUID | $MS_NODEV, "noinit_itable");
close $loop_fh;
move_tree("seed", "disk");
idmapped($base, "lower");
mount_fs("overlay", "root", "overlay", 0, "lowerdir=lower,upperdir=disk/upper,workdir=disk/work");
symlink("/proc/self/fd/3", "crun") or fail("link crun: $!");
exec { "$dir/crun" } "crun", "--root", $crun_root, "run", "--detach", "--bundle", $dir, "--pid-file", "$dir/pid", $id
  or fail("exec crun: $!");
