# ferrograph's sandbox setup. It runs as root of new mount, pid, network, IPC and UTS
# namespaces (made by util-linux's `unshare`; with a user namespace too when ferrograph does
# not run as root), builds a new root and starts the program in it as an unprivileged user.
#
# $1 an empty host folder to build the new root on   $2 the run's folder (host path)
# $3 bytes for the run's folder and for /tmp (tmpfs)   $4 uid   $5 gid
# $6 the cgroup.procs files to join, ':'-separated (may be empty)
# then the read-only paths, then "--", then the command line.
set -eu
trap 'echo "ferrograph-sandbox: setup failed (see the message above)" >&2; exit 125' EXIT
# The tools below live in sbin; the program gets the PATH it was given.
program_path=${PATH:-/usr/bin:/bin}
PATH=/usr/sbin:/usr/bin:/sbin:/bin
new=$1; run=$2; size=$3; uid=$4; gid=$5; procs=$6
shift 6

# Join the run's cgroups first: every process started below counts against its limits.
saved_ifs=$IFS; IFS=:
for f in $procs; do echo $$ > "$f"; done
IFS=$saved_ifs

mount --make-rprivate /
mount -t tmpfs -o mode=0755,size=8m ferrograph-root "$new"

# What the interpreter needs, read-only: folders are bound, symbolic links copied as links.
while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do
  p=$1; shift
  if [ -L "$p" ]; then
    mkdir -p "$new$(dirname "$p")"
    ln -s "$(readlink "$p")" "$new$p"
  elif [ -d "$p" ]; then
    mkdir -p "$new$p"
    mount --bind "$p" "$new$p"
    mount -o remount,bind,ro,nosuid,nodev "$new$p"
  elif [ -f "$p" ]; then
    mkdir -p "$new$(dirname "$p")"
    : > "$new$p"
    mount --bind "$p" "$new$p"
    mount -o remount,bind,ro,nosuid,nodev "$new$p"
  fi
done
[ "$#" -gt 0 ] && shift

mkdir -p "$new/dev" "$new/proc" "$new/tmp" "$new/etc" "$new/.old"
for d in null zero full random urandom; do
  : > "$new/dev/$d"
  mount --bind "/dev/$d" "$new/dev/$d"
done
ln -s /proc/self/fd "$new/dev/fd"
ln -s /proc/self/fd/0 "$new/dev/stdin"
ln -s /proc/self/fd/1 "$new/dev/stdout"
ln -s /proc/self/fd/2 "$new/dev/stderr"
# A /proc of this pid namespace only: no other process of the host is visible.
mount -t proc -o nosuid,nodev,noexec proc "$new/proc"
mount -t tmpfs -o "mode=1777,size=$size,nosuid,nodev" ferrograph-tmp "$new/tmp"
# The run's folder is a copy on a tmpfs of its own: its size is the run's disk quota, and
# nothing the program writes reaches the host.
mkdir -p "$new$run"
mount -t tmpfs -o "mode=0755,size=$size,nosuid,nodev" ferrograph-run "$new$run"
cp -a "$run/." "$new$run/"
chown -R "$uid:$gid" "$new$run"
[ -e "$new/etc/passwd" ] || echo "sandbox:x:$uid:$gid:ferrograph sandbox:$run:/bin/sh" > "$new/etc/passwd"
[ -e "$new/etc/group" ] || echo "sandbox:x:$gid:" > "$new/etc/group"
echo sandbox > "$new/etc/hostname"
hostname sandbox 2>/dev/null || true

mount -o remount,ro "$new"
cd "$new"
pivot_root . .old
umount -l /.old
cd "$run"
PATH=$program_path
unset OLDPWD
# In a user namespace made without a helper, setgroups(2) is denied: the supplementary
# groups there are already only the unmapped overflow group.
groups=--clear-groups
[ "$(cat /proc/self/setgroups 2>/dev/null || true)" = deny ] && groups=--keep-groups
trap - EXIT
exec setpriv --reuid="$uid" --regid="$gid" "$groups" --inh-caps=-all --bounding-set=-all --no-new-privs -- "$@"
