"""The user data script of a Batch host, as `tuning.host.HostTuning.render_script` fills it in.

Braces that belong to bash are doubled for str.format.
"""

SCRIPT = r"""#!/bin/bash
# iobatch host tuning: scratch volume and page-cache settings (rendered by tuning/host.py).
# Output goes to the cloud-init log; any failure exits non-zero so the problem is visible there.
set -euo pipefail

DEVICE={device}
DEFAULT_DEVICE={default_device}
# ebs: the volume the launch template attaches; instance-store: the instance's one NVMe instance store device.
SCRATCH={scratch}
STORE_MODEL={store_model}
SYS_BLOCK="${{IOBATCH_SYS_BLOCK:-/sys/block}}"
# How long an EBS volume may take to attach before the setup fails, in seconds.
DEVICE_WAIT="${{IOBATCH_DEVICE_WAIT:-120}}"
MOUNT_POINT={mount_point}
MOUNT_OPTIONS={options}
FILESYSTEM={filesystem}
SYSCTL_CONF="${{IOBATCH_SYSCTL_CONF:-{sysctl_conf}}}"
FSTAB="${{IOBATCH_FSTAB-/etc/fstab}}"
# IMDS as the host reaches it (the containers cannot: the launch template's hop limit is 1); empty: none (tests).
IMDS="${{IOBATCH_IMDS-http://169.254.169.254}}"
INSTANCE_FILE={instance_file}
# Where a failed setup says why before the host goes (the pipeline's log group; empty: only the console).
FAILURE_LOG_GROUP={failure_log_group}
PIPELINE={pipeline}
LAST_ERROR=""
# The Python this script runs (tuning/hostprogram.py: the failure's poster and the qualification), compressed.
HOST_PY='{host_py}'
hostpy() {{ python3 -I -c {launcher} "$HOST_PY" "$@"; }}
# Qualification (tuning/qualify.py): flag, fence or off, and what tuning/hostqualify.py takes.
QUALIFY={qualify}
QUALIFY_CONF={qualify_conf}

log() {{ echo "iobatch-host: $*" >&2; }}
die() {{ LAST_ERROR="$*"; echo "iobatch-host: FATAL: $*" >&2; exit 1; }}

imds() {{
  [ -n "$IMDS" ] || return 1
  local token
  token="$(curl -sf --connect-timeout 1 -m 3 -X PUT -H 'X-aws-ec2-metadata-token-ttl-seconds: 300' \
    "$IMDS/latest/api/token")" || return 1
  curl -sf --connect-timeout 1 -m 3 -H "X-aws-ec2-metadata-token: $token" "$IMDS/latest/meta-data/$1"
}}
INSTANCE_ID="$(imds instance-id || true)"
INSTANCE_TYPE="$(imds instance-type || true)"
[[ "$INSTANCE_ID" =~ ^i-[0-9a-f]{{8,32}}$ ]] || INSTANCE_ID=""
[[ "$INSTANCE_TYPE" =~ ^[a-z0-9-]+\.[a-z0-9-]+$ ]] || INSTANCE_TYPE=""

# A failed setup says why where it outlives the host: the EC2 console output (GetConsoleOutput) and one JSON event in
# the pipeline's log group, stream host-setup/<instance id>, which a metric filter counts and an alarm watches
# (infra/compute.py). Posted by python3 (tuning/hostpost.py): the ECS-optimized AL2023 AMI has no AWS CLI.
report_failure() {{
  local rc=$1 reason message
  reason="$(printf '%s' "${{LAST_ERROR:-exit $rc}}" | tr -c 'A-Za-z0-9 ._:/=,()+-' ' ' | cut -c1-400)"
  local format='{{"HostSetup": "failed", "Pipeline": "%s", "InstanceId": "%s", "InstanceType": "%s", "Reason": "%s"}}'
  message="$(printf "$format" "$PIPELINE" "${{INSTANCE_ID:-unknown}}" "${{INSTANCE_TYPE:-unknown}}" "$reason")"
  echo "iobatch-host: $message" > /dev/console 2>/dev/null || true
  if [ -z "$FAILURE_LOG_GROUP" ] || [ -z "$IMDS" ]; then return 0; fi
  if ! command -v python3 >/dev/null 2>&1; then log "no python3: the failure is only on the console"; return 0; fi
  IOBATCH_IMDS="$IMDS" IOBATCH_LOG_GROUP="$FAILURE_LOG_GROUP" IOBATCH_MESSAGE="$message" \
    IOBATCH_LOG_STREAM="host-setup/${{INSTANCE_ID:-unknown}}" \
    hostpy post || log "could not write the failure to log group $FAILURE_LOG_GROUP"
}}

# A host that could not prepare scratch must not take jobs: the ECS agent starts after cloud-init whether
# or not this script succeeded, and every job would then fail on the root disk. So on any failure: no
# ready marker, the agent stopped and masked (it cannot start or register), and the host shut down. A
# stopped instance is unhealthy to its Auto Scaling group, which replaces it ("Health checks for
# instances in an Auto Scaling group": any state other than running is unhealthy); the launch template
# terminates it on shutdown anyway. Only on a host with the ECS agent: elsewhere (tests) it only says so.
READY_MARKER={ready_marker}
fence_host() {{
  local rc=$?
  [ "$rc" -eq 0 ] && return 0
  rm -f "$MOUNT_POINT/$READY_MARKER" 2>/dev/null || true
  report_failure "$rc"
  if systemctl cat ecs.service >/dev/null 2>&1; then
    log "scratch setup failed (exit $rc): masking the ECS agent and shutting this host down"
    systemctl mask --now ecs.service || log "could not mask ecs.service"
    shutdown -h now "iobatch: scratch setup failed" || log "could not shut down"
  else
    log "scratch setup failed (exit $rc); no ECS agent here, nothing to fence"
  fi
  exit "$rc"
}}
trap fence_host EXIT

# A disk's NVMe model as sysfs shows it (padded with blanks; read trims them); empty where it shows none.
model_of() {{
  local model=""
  if [ -r "$SYS_BLOCK/$1/device/model" ]; then read -r model < "$SYS_BLOCK/$1/device/model" || true; fi
  echo "$model"
}}

# The scratch device: the name the launch template gave it, or else the one NVMe/xvd disk that has
# no partitions, no filesystem and is not mounted (the root disk always has one of those), and is not an instance
# store: a store is blank at boot too, and would be formatted while the EBS volume is still attaching. An EBS
# volume's NVMe model is "Amazon Elastic Block Store" (EC2 User Guide, "Amazon EBS and NVMe": nvme id-ctrl's mn), an
# instance store's STORE_MODEL (amazonlinux/amazon-ec2-utils, 70-ec2-nvme-devices.rules, which the AMI's udev applies:
# ATTRS{{model}} of each); a disk that shows no model (xvd, not NVMe) is never a store.
find_device() {{
  if [ -b "$DEFAULT_DEVICE" ]; then readlink -f "$DEFAULT_DEVICE"; return 0; fi
  local dev
  for dev in $(lsblk -dnpo NAME,TYPE | awk '$2 == "disk" {{print $1}}'); do
    if [ "$(model_of "${{dev##*/}}")" != "$STORE_MODEL" ] \
       && [ "$(lsblk -npo NAME "$dev" | wc -l)" -eq 1 ] \
       && [ -z "$(blkid -p -s TYPE -o value "$dev" || true)" ] \
       && ! findmnt -rn -S "$dev" >/dev/null; then
      echo "$dev"; return 0
    fi
  done
  return 1
}}

# The instance store devices: those whose NVMe model is STORE_MODEL.
find_stores() {{
  local dir
  for dir in "$SYS_BLOCK"/*; do
    if [ "$(model_of "${{dir##*/}}")" = "$STORE_MODEL" ]; then echo "/dev/${{dir##*/}}"; fi
  done
}}

if [ -z "$DEVICE" ] && [ "$SCRATCH" = "instance-store" ]; then
  mapfile -t stores < <(find_stores)
  [ "${{#stores[@]}}" -gt 0 ] \
    || die "no instance store device (NVMe model '$STORE_MODEL'): instance-store scratch needs a type with one" \
           "(m6id, c6id, r6id, i4i)"
  [ "${{#stores[@]}}" -eq 1 ] \
    || die "${{#stores[@]}} instance store devices (${{stores[*]}}): striping several is not built; use a size" \
           "with one store device"
  DEVICE="${{stores[0]}}"
elif [ -z "$DEVICE" ]; then
  # EBS volumes can attach a little after boot: look at once, then every 2 s for up to DEVICE_WAIT seconds.
  waited=0
  until DEVICE="$(find_device)"; do
    [ "$waited" -lt "$DEVICE_WAIT" ] \
      || die "no scratch device ($DEFAULT_DEVICE or a blank disk); not running jobs on the root disk"
    sleep 2
    waited=$((waited + 2))
  done
fi
[ -b "$DEVICE" ] || die "scratch device $DEVICE is not a block device"
log "scratch device $DEVICE ($SCRATCH)"

current_fs="$(blkid -p -s TYPE -o value "$DEVICE" || true)"
if [ -z "$current_fs" ]; then
  log "making $FILESYSTEM on blank $DEVICE"
  {mkfs} "$DEVICE"
elif [ "$current_fs" != "$FILESYSTEM" ]; then
  die "$DEVICE holds $current_fs, not $FILESYSTEM; not formatting a device that has data"
fi

mkdir -p "$MOUNT_POINT"
if ! findmnt -rn -S "$DEVICE" -M "$MOUNT_POINT" >/dev/null; then
  mount -t "$FILESYSTEM" -o "$MOUNT_OPTIONS" "$DEVICE" "$MOUNT_POINT" \
    || die "mount -t $FILESYSTEM -o $MOUNT_OPTIONS $DEVICE $MOUNT_POINT failed"
fi
if [ -n "$FSTAB" ]; then
  uuid="$(blkid -s UUID -o value "$DEVICE")"
  grep -q "UUID=$uuid " "$FSTAB" 2>/dev/null \
    || echo "UUID=$uuid $MOUNT_POINT $FILESYSTEM $MOUNT_OPTIONS 0 2" >> "$FSTAB"
fi
# Containers run as any user; the sticky bit keeps children from deleting each other's files.
chmod 1777 "$MOUNT_POINT"

mounted_fs="$(findmnt -rn -o FSTYPE -M "$MOUNT_POINT" || true)"
[ "$mounted_fs" = "$FILESYSTEM" ] || die "$MOUNT_POINT is not mounted as $FILESYSTEM (found '$mounted_fs')"
log "mounted $DEVICE on $MOUNT_POINT: $(findmnt -rn -o OPTIONS -M "$MOUNT_POINT")"

mkdir -p "$(dirname "$SYSCTL_CONF")"
cat > "$SYSCTL_CONF" <<'IOBATCH_SYSCTL'
# iobatch page-cache tuning (tuning/host.py)
{sysctl_body}IOBATCH_SYSCTL
sysctl -q -p "$SYSCTL_CONF" || die "sysctl -p $SYSCTL_CONF failed"
for key in {sysctl_keys}; do
  want="$(awk -F' = ' -v k="$key" '$1 == k {{print $2}}' "$SYSCTL_CONF")"
  have="$(sysctl -n "$key")"
  [ "$have" = "$want" ] || die "$key is $have after applying $SYSCTL_CONF, not $want"
done
log "sysctls applied from $SYSCTL_CONF"

# The instance's id and type where the profiler reads them (profiling/identity.py), root's and read-only to jobs.
if [ -n "$INSTANCE_ID" ] && [ -n "$INSTANCE_TYPE" ]; then
  printf '{{"InstanceId": "%s", "InstanceType": "%s"}}\n' "$INSTANCE_ID" "$INSTANCE_TYPE" \
    > "$MOUNT_POINT/$INSTANCE_FILE.tmp"
  chmod 0644 "$MOUNT_POINT/$INSTANCE_FILE.tmp"
  mv -f "$MOUNT_POINT/$INSTANCE_FILE.tmp" "$MOUNT_POINT/$INSTANCE_FILE"
else
  log "no instance id from IMDS: the profiles will name the instance unknown"
fi

# Qualification: scratch measured as the children will use it, before the host takes jobs (tuning/hostqualify.py):
# the figures in the file every child's profiler reads, one event in the log group, and with hostQualification=fence
# a slow host (within the pipeline's fences of the hour) fails its setup, so it shuts down with the reason.
if [ "$QUALIFY" != off ] && command -v python3 >/dev/null 2>&1; then
  qrc=0
  qline="$(IOBATCH_IMDS="$IMDS" IOBATCH_LOG_GROUP="$FAILURE_LOG_GROUP" \
    hostpy qualify "$QUALIFY_CONF" "$INSTANCE_ID" "$INSTANCE_TYPE")" || qrc=$?
  [ "$qrc" -ne 3 ] || die "$qline"
  log "qualification (exit $qrc): $qline"
fi

# Last: the marker that tells jobs this is the prepared volume (written whole, then renamed).
echo "prepared $(date -u +%Y-%m-%dT%H:%M:%SZ) device=$DEVICE scratch=$SCRATCH filesystem=$FILESYSTEM" \
  > "$MOUNT_POINT/$READY_MARKER.tmp"
mv -f "$MOUNT_POINT/$READY_MARKER.tmp" "$MOUNT_POINT/$READY_MARKER"
log "scratch ready: $MOUNT_POINT/$READY_MARKER"
"""
