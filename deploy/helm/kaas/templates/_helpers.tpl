{{/* Names and labels shared by every template. */}}
{{- define "kaas.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kaas.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "kaas.headless" -}}
{{- printf "%s-brokers" (include "kaas.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kaas.operatorName" -}}
{{- printf "%s-operator" (include "kaas.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kaas.dataClaim" -}}
{{- default (printf "%s-data" (include "kaas.fullname" .)) .Values.storage.data.existingClaim -}}
{{- end -}}

{{- define "kaas.controlPlaneClaim" -}}
{{- default (printf "%s-control-plane" (include "kaas.fullname" .)) .Values.storage.controlPlane.existingClaim -}}
{{- end -}}

{{- define "kaas.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "kaas.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "kaas.brokerSelector" -}}
app.kubernetes.io/name: {{ include "kaas.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: broker
{{- end -}}

{{- define "kaas.operatorSelector" -}}
app.kubernetes.io/name: {{ include "kaas.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "kaas.image" -}}
{{- printf "%s:%s" .image.repository (default .chart.AppVersion .image.tag) -}}
{{- end -}}

{{/* terminationGracePeriodSeconds: above the controlled-shutdown timeout
     plus the 3 s the broker gives its closes and last heartbeat after it. */}}
{{- define "kaas.gracePeriod" -}}
{{- $shutdown := add (div (add .Values.broker.shutdownTimeoutMs 999) 1000) 3 -}}
{{- if kindIs "invalid" .Values.broker.terminationGracePeriodSeconds -}}
{{- add $shutdown 15 -}}
{{- else -}}
{{- $g := int .Values.broker.terminationGracePeriodSeconds -}}
{{- if le $g $shutdown -}}
{{- fail (printf "broker.terminationGracePeriodSeconds (%d) must exceed broker.shutdownTimeoutMs (%d ms) + 3 s: the kubelet would SIGKILL the broker in the middle of its partition hand-off" $g (int .Values.broker.shutdownTimeoutMs)) -}}
{{- end -}}
{{- $g -}}
{{- end -}}
{{- end -}}

{{/*
Where the brokers' cluster state lives, in the form the chart records it on
the StatefulSet (annotation kaas.io/cluster-dir) and compares on upgrade:
"data" (KAAS_CLUSTER_DIR unset: <data>/__cluster on the data volume) or
"claim:<name>" (the control-plane claim, mounted at KAAS_CLUSTER_DIR).
*/}}
{{- define "kaas.clusterDir" -}}
{{- if .Values.storage.controlPlane.enabled -}}
{{- printf "claim:%s" (include "kaas.controlPlaneClaim" .) -}}
{{- else -}}
data
{{- end -}}
{{- end -}}

{{/*
The same for a live StatefulSet (a `lookup` result, passed as .sts, with the
data claim as .dataClaim). Its kaas.io/cluster-dir annotation when it has
one. A StatefulSet from a chart that did not record it is read from its pod
spec, never guessed: no KAAS_CLUSTER_DIR env and no --cluster-dir argument on
the broker container = "data"; KAAS_CLUSTER_DIR equal to the mount path of a
whole volume (no subPath) from a claim other than the data claim =
"claim:<that claim>"; anything else (a --cluster-dir argument, a valueFrom,
a path that is not such a mount) = "unknown", which no values match.
*/}}
{{- define "kaas.liveClusterDir" -}}
{{- $recorded := dig "metadata" "annotations" "kaas.io/cluster-dir" "" .sts -}}
{{- if $recorded -}}
{{- $recorded -}}
{{- else -}}
{{- $pod := dig "spec" "template" "spec" dict .sts -}}
{{- $broker := dict -}}
{{- range (get $pod "containers" | default list) -}}
{{- if eq (get . "name") "broker" -}}{{- $broker = . -}}{{- end -}}
{{- end -}}
{{- $result := "data" -}}
{{- $dir := "" -}}
{{- range (get $broker "env" | default list) -}}
{{- if eq (get . "name") "KAAS_CLUSTER_DIR" -}}
{{- $result = "unknown" -}}
{{- $dir = hasKey . "value" | ternary (get . "value" | toString) "" -}}
{{- end -}}
{{- end -}}
{{- range concat (get $broker "command" | default list) (get $broker "args" | default list) -}}
{{- if hasPrefix "--cluster-dir" (toString .) -}}
{{- $result = "unknown" -}}
{{- $dir = "" -}}
{{- end -}}
{{- end -}}
{{- if $dir -}}
{{- range (get $broker "volumeMounts" | default list) -}}
{{- if and (eq (trimSuffix "/" (get . "mountPath" | toString)) (trimSuffix "/" $dir)) (not (get . "subPath")) -}}
{{- $volume := get . "name" -}}
{{- range (get $pod "volumes" | default list) -}}
{{- $claim := dig "persistentVolumeClaim" "claimName" "" . -}}
{{- if and (eq (get . "name") $volume) $claim (ne $claim $.dataClaim) -}}
{{- $result = printf "claim:%s" $claim -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $result -}}
{{- end -}}
{{- end -}}

{{/* Human words for a cluster-dir value, for the refusal messages. */}}
{{- define "kaas.describeClusterDir" -}}
{{- if eq . "data" -}}
<data volume>/__cluster (storage.controlPlane.enabled=false)
{{- else if hasPrefix "claim:" . -}}
the control-plane claim {{ trimPrefix "claim:" . }}
{{- else -}}
a place this chart cannot tell (KAAS_CLUSTER_DIR or --cluster-dir set outside storage.controlPlane)
{{- end -}}
{{- end -}}

{{/*
Refuses to render a StatefulSet that would put the cluster state somewhere
else than a running one over the same data volume keeps it.

Every StatefulSet in the release namespace that runs kaas brokers (it has
the kaas.io/cluster-dir annotation, or the broker component label and a
container named broker) and mounts this release's data claim is looked up
(`lookup`; empty under `helm template` and client-side dry runs, so a fresh
render is never refused). If its cluster dir differs from the one these
values render, a rolling update would start brokers on a second cluster
directory over the same partition logs: two clusters on one data volume,
which loses acknowledged records. That is refused, unless
storage.controlPlane.movedFrom names exactly the live StatefulSet's cluster
dir (the operator moved the state offline with `kaas move-cluster-dir`),
and even then only while the StatefulSet is scaled to 0 with no broker pod
left and the target claim exists.
*/}}
{{- define "kaas.controlPlaneGuard" -}}
{{- $want := include "kaas.clusterDir" . -}}
{{- $dataClaim := include "kaas.dataClaim" . -}}
{{- $moved := .Values.storage.controlPlane.movedFrom | default "" -}}
{{- $ns := .Release.Namespace -}}
{{- $live := lookup "apps/v1" "StatefulSet" $ns "" -}}
{{- range $sts := (get $live "items" | default list) -}}
{{- $name := dig "metadata" "name" "" $sts -}}
{{- $annotated := hasKey (dig "metadata" "annotations" dict $sts) "kaas.io/cluster-dir" -}}
{{- $brokers := false -}}
{{- range (dig "spec" "template" "spec" "containers" list $sts) -}}
{{- if eq (get . "name") "broker" -}}{{- $brokers = true -}}{{- end -}}
{{- end -}}
{{- $brokers = or $annotated (and $brokers (eq (dig "metadata" "labels" "app.kubernetes.io/component" "" $sts) "broker")) -}}
{{- $shares := false -}}
{{- range (dig "spec" "template" "spec" "volumes" list $sts) -}}
{{- if eq (dig "persistentVolumeClaim" "claimName" "" .) $dataClaim -}}{{- $shares = true -}}{{- end -}}
{{- end -}}
{{- if and $brokers $shares -}}
{{- $have := include "kaas.liveClusterDir" (dict "sts" $sts "dataClaim" $dataClaim) -}}
{{- if ne $have $want -}}
{{- $where := printf "StatefulSet %s/%s runs kaas brokers over the data claim %s with their cluster state in %s; these values put it in %s." $ns $name $dataClaim (include "kaas.describeClusterDir" $have) (include "kaas.describeClusterDir" $want) -}}
{{- if ne $moved $have -}}
{{- $from := "<mount of the current control-plane claim>" -}}
{{- if eq $have "data" -}}{{- $from = "<data volume mount>/__cluster" -}}{{- end -}}
{{- if eq $have "unknown" -}}{{- $from = "<the broker container's current KAAS_CLUSTER_DIR>" -}}{{- end -}}
{{- $to := ternary "<data volume mount>/__cluster" "<mount of the new control-plane claim>" (eq $want "data") -}}
{{- $create := "" -}}
{{- if and (ne $want "data") (not $.Values.storage.controlPlane.existingClaim) -}}
{{- $create = printf "; the target claim must exist before this step, and the chart creates %s only during the upgrade: create the claim yourself (ReadWriteMany) and name it in storage.controlPlane.existingClaim" (trimPrefix "claim:" $want) -}}
{{- end -}}
{{- fail (printf `
storage.controlPlane: refusing to move the brokers' cluster state under a running cluster.
%s
An upgrade would roll the brokers one by one onto a second, different cluster directory over the same data volume: two clusters (two controllers, two assignments) writing one set of partition logs, which silently loses acknowledged records.
Moving the cluster state is an offline operation (chart README, "Moving the control plane"):
  1. stop: kubectl -n %s scale statefulset/%s --replicas=0 (and the operator Deployment), and wait until no broker pod is left;
  2. move: kaas move-cluster-dir --from %s --to %s, in a pod that mounts both volumes%s;
  3. start: helm upgrade with these values and --set storage.controlPlane.movedFrom=%s (helm 4: add --force-conflicts, to take spec.replicas back from kubectl scale).
To leave the cluster state where it is, keep the installed storage.controlPlane values.` $where $ns $name $from $to $create $have) -}}
{{- end -}}
{{- if ne (int (dig "spec" "replicas" 1 $sts)) 0 -}}
{{- fail (printf "\nstorage.controlPlane.movedFrom=%s acknowledges an offline move, but %s\nThe StatefulSet still has %d replicas: stop the brokers first (kubectl -n %s scale statefulset/%s --replicas=0), move the state with kaas move-cluster-dir, then upgrade." $moved $where (int (dig "spec" "replicas" 1 $sts)) $ns $name) -}}
{{- end -}}
{{- $selector := dig "spec" "selector" "matchLabels" dict $sts -}}
{{- if $selector -}}
{{- range (get (lookup "v1" "Pod" $ns "") "items" | default list) -}}
{{- $labels := dig "metadata" "labels" dict . -}}
{{- $match := true -}}
{{- range $k, $v := $selector -}}
{{- if ne (get $labels $k | toString) (toString $v) -}}{{- $match = false -}}{{- end -}}
{{- end -}}
{{- if $match -}}
{{- fail (printf "\nstorage.controlPlane.movedFrom=%s acknowledges an offline move, but %s\nPod %s/%s of that StatefulSet still exists: wait until every broker pod is gone before moving the state and upgrading." $moved $where $ns (dig "metadata" "name" "" .)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if hasPrefix "claim:" $want -}}
{{- if not (lookup "v1" "PersistentVolumeClaim" $ns (trimPrefix "claim:" $want)) -}}
{{- fail (printf "\nstorage.controlPlane.movedFrom=%s acknowledges an offline move, but %s\nThe claim %s does not exist, so nothing can have been moved into it: create it, run kaas move-cluster-dir into it with the brokers stopped, and name it in storage.controlPlane.existingClaim." $moved $where (trimPrefix "claim:" $want)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
The chart records where the cluster state lives (kaas.controlPlaneGuard):
extraEnv / extraArgs that would move it (or the data dir) behind its back
are refused.
*/}}
{{- define "kaas.noDirOverrides" -}}
{{- range .Values.broker.extraEnv -}}
{{- if has (get . "name") (list "KAAS_CLUSTER_DIR" "KAAS_DATA_DIR") -}}
{{- fail (printf "broker.extraEnv sets %s: set storage.controlPlane / storage.data instead (the chart records where the cluster state lives and refuses to move it on a running cluster)" (get . "name")) -}}
{{- end -}}
{{- end -}}
{{- range .Values.broker.extraArgs -}}
{{- if or (hasPrefix "--cluster-dir" (toString .)) (hasPrefix "--data-dir" (toString .)) -}}
{{- fail (printf "broker.extraArgs has %s: set storage.controlPlane / storage.data instead (the chart records where the cluster state lives and refuses to move it on a running cluster)" (toString .)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
