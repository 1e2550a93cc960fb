{{/* Names and shared snippets. */}}
{{- define "chamber.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}{{ .Release.Name | trunc 50 | trimSuffix "-" }}{{- else -}}{{ printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" }}{{- end -}}
{{- end -}}

{{/* Names with a suffix, each within its kind's limit (found by review: from a 34-character release name on, the
CronJob's name passed 52 characters, and the NATS headless Service's 63, and the install failed). A StatefulSet's
name is kept to 52 (its pods' controller-revision-hash label adds 11). Names that fit are as they were. */}}
{{- define "chamber.natsName" -}}{{ printf "%s-nats" (include "chamber.fullname" .) | trunc 52 | trimSuffix "-" }}{{- end -}}
{{- define "chamber.valkeyName" -}}{{ printf "%s-valkey" (include "chamber.fullname" .) | trunc 52 | trimSuffix "-" }}{{- end -}}
{{- define "chamber.certRenewName" -}}{{ printf "%s-webhook-cert-renew" (include "chamber.fullname" .) | trunc 52 | trimSuffix "-" }}{{- end -}}

{{- define "chamber.labels" -}}
app.kubernetes.io/name: chamber
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "chamber.selector" -}}
app.kubernetes.io/name: chamber
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "chamber.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "chamber.natsUrl" -}}
{{- if .Values.nats.enabled -}}
nats://{{ if .Values.nats.auth.enabled }}chamber:$(CHAMBER_NATS_PASSWORD)@{{ end }}{{ include "chamber.natsName" . }}:4222
{{- else -}}{{ .Values.nats.url }}{{- end -}}
{{- end -}}

{{/* A generated secret that stays the same across upgrades: the value given, else the one the Secret `name`
already holds under `key` (Helm's lookup; empty under `helm template`), else 32 random letters and digits.
Arguments: root, name, key, given. */}}
{{- define "chamber.keptSecret" -}}
{{- $value := .given -}}
{{- if not $value -}}
{{- $old := lookup "v1" "Secret" .root.Release.Namespace .name -}}
{{- if and $old $old.data (hasKey $old.data .key) -}}
{{- $value = index $old.data .key | b64dec -}}
{{- end -}}
{{- end -}}
{{- $value | default (randAlphaNum 32) -}}
{{- end -}}

{{/* The pod annotation that changes with the configuration the health and quota services read only at start
(their rules and seed), so an edit restarts them. Passwords are left out on purpose: any hash of one, on a pod
anyone may read, is a verifier for an offline guess; after changing a password, restart the pods (docs). */}}
{{- define "chamber.configChecksum" -}}
checksum/config: {{ toJson (list .Values.health.rules .Values.quota.config) | sha256sum | trunc 16 | quote }}
{{- end -}}

{{- define "chamber.webhookService" -}}{{ include "chamber.fullname" . }}-webhooks{{- end -}}
{{- define "chamber.webhookSecret" -}}{{ include "chamber.fullname" . }}-webhook-tls{{- end -}}

{{/* The environment every Chamber container shares: where the bus and the ledger are, and how to log. */}}
{{/* A container's liveness, judged by the file its event loop touches (chamber.common.alive): the env that turns
the touching on, and the probe. */}}
{{- define "chamber.aliveEnv" -}}
- name: CHAMBER_ALIVE_FILE
  value: /tmp/chamber-alive
{{- end -}}

{{- define "chamber.liveness" -}}
exec:
  command: ["python", "-m", "chamber.common.alive", "/tmp/chamber-alive", {{ .Values.liveness.maxAgeSeconds | quote }}]
periodSeconds: {{ .Values.liveness.periodSeconds }}
timeoutSeconds: 5
failureThreshold: {{ .Values.liveness.failureThreshold }}
{{- end -}}

{{- define "chamber.env" -}}
{{ include "chamber.busEnv" . }}
{{ include "chamber.ledgerEnv" . }}
{{- end -}}

{{/* Where the ledger is (Valkey/Redis): not for the node agent, which never opens it (a pod on a GPU node, next to
user workloads, that could write the ledger could double-book GPUs: found by review). */}}
{{- define "chamber.ledgerEnv" -}}
{{- if .Values.valkey.enabled }}
{{- if .Values.valkey.auth.enabled }}
- name: VALKEY_PASSWORD
  valueFrom: {secretKeyRef: {name: {{ include "chamber.valkeyName" . }}, key: password}}
- name: CHAMBER_REDIS_URL
  value: "redis://:$(VALKEY_PASSWORD)@{{ include "chamber.valkeyName" . }}:6379/0"
{{- else }}
- name: CHAMBER_REDIS_URL
  value: "redis://{{ include "chamber.valkeyName" . }}:6379/0"
{{- end }}
{{- else if .Values.valkey.existingSecret }}
- name: CHAMBER_REDIS_URL
  valueFrom: {secretKeyRef: {name: {{ .Values.valkey.existingSecret }}, key: url}}
{{- else }}
- name: CHAMBER_REDIS_URL
  value: {{ .Values.valkey.url | quote }}
{{- end }}
{{- end -}}

{{/* Where the bus is, and how to log. */}}
{{- define "chamber.busEnv" -}}
{{- if and (not .Values.nats.enabled) .Values.nats.existingSecret }}
- name: CHAMBER_NATS_URL
  valueFrom: {secretKeyRef: {name: {{ .Values.nats.existingSecret }}, key: url}}
{{- else }}
{{- if and .Values.nats.enabled .Values.nats.auth.enabled }}
- name: CHAMBER_NATS_PASSWORD
  valueFrom: {secretKeyRef: {name: {{ include "chamber.natsName" . }}, key: password}}
{{- end }}
- name: CHAMBER_NATS_URL
  value: {{ include "chamber.natsUrl" . | quote }}
{{- end }}
{{- if .Values.nats.streamReplicas }}
- name: CHAMBER_NATS_REPLICAS
  value: {{ min 3 (int .Values.nats.streamReplicas) | quote }}
{{- else if .Values.nats.enabled }}
- name: CHAMBER_NATS_REPLICAS
  value: {{ min 3 (int .Values.nats.replicas) | quote }}
{{- end }}
- name: CHAMBER_NAMESPACE
  value: {{ .Values.busNamespace | quote }}
- name: CHAMBER_LOG_LEVEL
  value: {{ .Values.logLevel | quote }}
- name: CHAMBER_LOG_FORMAT
  value: {{ .Values.logFormat | quote }}
- name: CHAMBER_INVENTORY_SOURCE
  value: kubernetes
- name: CHAMBER_FLEET_NODES
  value: "0"
{{- end -}}

{{- define "chamber.kubeEnv" -}}
- name: CHAMBER_KUBE_API
  value: in-cluster
- name: CHAMBER_KUBE_NAMESPACES
  value: {{ join "," .Values.kubernetes.namespaces | quote }}
- name: CHAMBER_KUBE_POOL_LABEL
  value: {{ .Values.kubernetes.poolLabel | quote }}
- name: CHAMBER_POOL
  value: {{ .Values.kubernetes.defaultPool | quote }}
- name: CHAMBER_POOL_COST_PER_GPU_HOUR
  value: {{ .Values.kubernetes.costPerGpuHour | quote }}
{{- end -}}

{{/* A Chamber service's pod spec. Arguments: root, component, env (extra), volumes, mounts, ports, and readiness (the
liveness probe is every service's: chamber.liveness). */}}
{{- define "chamber.podSpec" -}}
serviceAccountName: {{ include "chamber.fullname" .root }}-{{ .component }}
automountServiceAccountToken: {{ .kube | default false }}
{{- with .root.Values.imagePullSecrets }}
imagePullSecrets: {{ toYaml . | nindent 2 }}
{{- end }}
securityContext: {{ toYaml .root.Values.podSecurityContext | nindent 2 }}
containers:
  - name: {{ .component }}
    image: {{ include "chamber.image" .root | quote }}
    imagePullPolicy: {{ .root.Values.image.pullPolicy }}
    args: ["service", {{ .service | default .component | quote }}]
    env:
      {{- include "chamber.env" .root | nindent 6 }}
      {{- include "chamber.aliveEnv" .root | nindent 6 }}
      {{- if .kube }}
      {{- include "chamber.kubeEnv" .root | nindent 6 }}
      {{- end }}
      {{- with .env }}
      {{- toYaml . | nindent 6 }}
      {{- end }}
    {{- with .ports }}
    ports: {{ toYaml . | nindent 6 }}
    {{- end }}
    {{- with .readiness }}
    readinessProbe: {{ toYaml . | nindent 6 }}
    {{- end }}
    livenessProbe: {{ include "chamber.liveness" .root | nindent 6 }}
    resources: {{ toYaml .resources | nindent 6 }}
    securityContext: {{ toYaml .root.Values.securityContext | nindent 6 }}
    volumeMounts:
      - {name: tmp, mountPath: /tmp}
      {{- with .mounts }}
      {{- toYaml . | nindent 6 }}
      {{- end }}
volumes:
  - name: tmp
    emptyDir: {}
  {{- with .volumes }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end -}}

{{/* Where Chamber's own pods run (`controlPlane`): node selector, tolerations, priority class, and (with `extra`, an
affinity of the pod's own) the affinity. Goes in a pod spec. */}}
{{- define "chamber.placement" -}}
{{- $cp := .root.Values.controlPlane -}}
{{- with $cp.nodeSelector }}
nodeSelector: {{ toYaml . | nindent 2 }}
{{- end }}
{{- with $cp.tolerations }}
tolerations: {{ toYaml . | nindent 2 }}
{{- end }}
{{- with $cp.priorityClassName }}
priorityClassName: {{ . | quote }}
{{- end }}
{{- $affinity := dict -}}
{{- with $cp.nodeAffinity }}{{- $_ := set $affinity "nodeAffinity" . -}}{{- end }}
{{- with .extra }}{{- $affinity = merge $affinity . -}}{{- end }}
{{- with $affinity }}
affinity: {{ toYaml . | nindent 2 }}
{{- end }}
{{- end -}}
