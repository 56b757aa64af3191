{{/* Names and labels. */}}
{{- define "idemproxy.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
Every named template here works in two contexts: this chart's own, and a
parent chart's that vendors this one as a dependency and includes
"idemproxy.sidecar" and "idemproxy.volumes" in its own pod spec. In the
parent's context .Values are the parent's, this chart's being under
.Values.idemproxy, and .Chart is the parent's: so names never come from
.Chart.Name, and each template finds its values with this block:

  {{- $v := .Values -}}
  {{- if and (kindIs "map" .Values.idemproxy) (hasKey .Values.idemproxy "config") -}}{{- $v = .Values.idemproxy -}}{{- end -}}
*/}}

{{- define "idemproxy.fullname" -}}
{{- $v := .Values -}}
{{- if and (kindIs "map" .Values.idemproxy) (hasKey .Values.idemproxy "config") -}}{{- $v = .Values.idemproxy -}}{{- end -}}
{{- if $v.fullnameOverride -}}
{{- $v.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains "idemproxy" .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-idemproxy" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/*
idemproxy.podLabels go on every pod that carries the sidecar (the example
app's, and yours: include it in your pod template's labels); the
Services, the PodDisruptionBudget and the NetworkPolicy select pods by
idemproxy.podSelector, which is .Values.podSelector when set, else these.
*/}}
{{- define "idemproxy.podLabels" -}}
idemproxy.io/sidecar: {{ include "idemproxy.fullname" . }}
{{- end -}}

{{- define "idemproxy.podSelector" -}}
{{- $v := .Values -}}
{{- if and (kindIs "map" .Values.idemproxy) (hasKey .Values.idemproxy "config") -}}{{- $v = .Values.idemproxy -}}{{- end -}}
{{- if $v.podSelector -}}
{{- toYaml $v.podSelector -}}
{{- else -}}
{{- include "idemproxy.podLabels" . -}}
{{- end -}}
{{- end -}}

{{/*
idemproxy.podAnnotations roll the pods when a restart-only setting
changes: the checksum covers the rendered config without what reloads in
place (routes, defaults, log_level), so a route-only change does not
restart anything. Include it in your pod template's annotations.
*/}}
{{- define "idemproxy.podAnnotations" -}}
checksum/idemproxy-config: {{ omit (include "idemproxy.config" . | fromYaml) "routes" "defaults" "log_level" | toYaml | sha256sum }}
{{- end -}}

{{- define "idemproxy.selectorLabels" -}}
app.kubernetes.io/name: {{ include "idemproxy.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "idemproxy.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- .Values.serviceAccount.name | default (include "idemproxy.fullname" .) -}}
{{- else -}}
{{- .Values.serviceAccount.name | default "default" -}}
{{- end -}}
{{- end -}}

{{- define "idemproxy.labels" -}}
{{ include "idemproxy.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/*
idemproxy.config is the sidecar's config file: .Values.config with the
Redis deployment and the mounted key files filled in.
*/}}
{{- define "idemproxy.config" -}}
{{- $v := .Values -}}
{{- $appVersion := .Chart.AppVersion -}}
{{- if and (kindIs "map" .Values.idemproxy) (hasKey .Values.idemproxy "config") -}}
{{- $v = .Values.idemproxy -}}
{{- with .Subcharts -}}{{- with index . "idemproxy" -}}{{- $appVersion = .Chart.AppVersion -}}{{- end -}}{{- end -}}
{{- end -}}
{{- $cfg := deepCopy $v.config -}}
{{- $store := get $cfg "store" | default dict -}}
{{- if $v.postgres.url -}}
{{- $pg := dict "url" $v.postgres.url "schema" $v.postgres.schema "create_schema" $v.postgres.createSchema "max_conns" (int $v.postgres.maxConns) -}}
{{- if $v.postgres.listenUrl -}}
{{- $_ := set $pg "listen_url" $v.postgres.listenUrl -}}
{{- end -}}
{{- if $v.postgres.existingSecret -}}
{{- $_ := set $pg "password_file" "/var/run/secrets/idemproxy-postgres/password" -}}
{{- end -}}
{{- $_ := set $store "postgres" $pg -}}
{{- else -}}
{{- $redis := dict "addrs" $v.redis.addrs -}}
{{- if eq $v.redis.mode "sentinel" -}}
{{- $_ := set $redis "master_name" (required "redis.masterName is required with redis.mode sentinel" $v.redis.masterName) -}}
{{- else if not (has $v.redis.mode (list "standalone" "cluster")) -}}
{{- fail (printf "redis.mode must be standalone, sentinel or cluster, got %q" $v.redis.mode) -}}
{{- end -}}
{{- if and (eq $v.redis.mode "standalone") (ne (len $v.redis.addrs) 1) -}}
{{- fail "redis.mode standalone takes exactly one address in redis.addrs" -}}
{{- end -}}
{{- if $v.redis.existingSecret -}}
{{- $_ := set $redis "password_file" "/var/run/secrets/idemproxy-redis/password" -}}
{{- if $v.redis.sentinelPasswordKey -}}
{{- $_ := set $redis "sentinel_password_file" "/var/run/secrets/idemproxy-redis/sentinel-password" -}}
{{- end -}}
{{- end -}}
{{- $_ := set $store "redis" $redis -}}
{{- end -}}
{{- if $v.encryption.existingSecret -}}
{{- $files := list -}}
{{- range $v.encryption.keys -}}
{{- $files = append $files (printf "/var/run/secrets/idemproxy-keys/%s" .) -}}
{{- end -}}
{{- $_ := set $store "encryption" (dict "key_files" $files "required" $v.encryption.required) -}}
{{- if $v.encryption.keySecretKey -}}
{{- $_ := set $store "key_secret_file" (printf "/var/run/secrets/idemproxy-keys/%s" $v.encryption.keySecretKey) -}}
{{- if not (hasKey $store "record_format") -}}
{{- $_ := set $store "record_format" (int $v.encryption.recordFormat) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if and (eq (int (get $store "record_format" | default 1)) 2) (not (hasKey $store "key_secret_file")) -}}
{{- fail "store.record_format 2 keys fingerprints with a key secret: set encryption.existingSecret and encryption.keySecretKey, or another format (1, or 3 and 4, which need no key secret)" -}}
{{- end -}}
{{- $_ := set $cfg "store" $store -}}
{{- include "idemproxy.needsRelease" (dict "cfg" $cfg "tag" ($v.image.tag | default $appVersion)) -}}
{{- if $v.adminToken.existingSecret -}}
{{- $_ := set $cfg "admin" (dict "token_file" "/var/run/secrets/idemproxy-admin/token") -}}
{{- end -}}
{{- toYaml $cfg -}}
{{- end -}}

{{/*
idemproxy.sidecar renders the sidecar container. Put it under
initContainers (a native sidecar, Kubernetes >= 1.29: it starts before the
app and stops after it), with the volumes of "idemproxy.volumes", the pod
labels of "idemproxy.podLabels" and the annotations of
"idemproxy.podAnnotations":

  template:
    metadata:
      labels:
        {{- include "idemproxy.podLabels" . | nindent 8 }}
      annotations:
        {{- include "idemproxy.podAnnotations" . | nindent 8 }}
    spec:
      initContainers:
        {{- include "idemproxy.sidecar" . | nindent 8 }}
      volumes:
        {{- include "idemproxy.volumes" . | nindent 8 }}

It reads image, sidecar, redis, encryption, adminToken and config from
this chart's values: .Values in its own templates, .Values.idemproxy in a
parent chart that vendors it as a dependency named idemproxy.
*/}}
{{- define "idemproxy.sidecar" -}}
{{- $v := .Values -}}
{{- $appVersion := .Chart.AppVersion -}}
{{- if and (kindIs "map" $v.idemproxy) (hasKey $v.idemproxy "config") -}}
{{- $v = $v.idemproxy -}}
{{- with .Subcharts -}}{{- with index . "idemproxy" -}}{{- $appVersion = .Chart.AppVersion -}}{{- end -}}{{- end -}}
{{- end -}}
- name: idemproxy
  image: "{{ $v.image.repository }}:{{ $v.image.tag | default $appVersion }}"
  imagePullPolicy: {{ $v.image.pullPolicy }}
  restartPolicy: Always
  args: ["-config", "/etc/idemproxy/config.yaml"]
  ports:
    - name: http
      containerPort: {{ include "idemproxy.httpPort" $v }}
    - name: admin
      containerPort: {{ include "idemproxy.adminPort" $v }}
  env:
    # The Go GC works harder as the heap nears the container's limit
    # instead of letting a burst of large bodies end in an OOM kill.
    # 90% of the container's memory limit: the rest is for what the Go
    # heap does not count (stacks, the runtime, cgo-free buffers), so the
    # GC works harder before the kernel kills the container.
    - name: GOMEMLIMIT
      value: {{ include "idemproxy.gomemlimit" . | quote }}
    # Bounded by GOMEMLIMIT, a less frequent GC costs 6-11% less CPU per
    # request for ~12 MiB (docs/operations.md, Memory).
    - name: GOGC
      value: "400"
    {{- with $v.sidecar.env }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  startupProbe:
    httpGet: {path: /healthz, port: admin}
    periodSeconds: 1
    failureThreshold: 30
  livenessProbe:
    httpGet: {path: /healthz, port: admin}
    periodSeconds: 10
  readinessProbe:
    httpGet: {path: /readyz, port: admin}
    periodSeconds: 2
    failureThreshold: 2
  resources:
    {{- toYaml $v.sidecar.resources | nindent 4 }}
  securityContext:
    runAsNonRoot: true
    runAsUser: 65532
    runAsGroup: 65532
    readOnlyRootFilesystem: true
    allowPrivilegeEscalation: false
    capabilities:
      drop: ["ALL"]
    # On the container, not only the pod: a pod of yours that includes
    # this template gets it whatever its own securityContext says.
    seccompProfile:
      type: RuntimeDefault
  volumeMounts:
    - name: idemproxy-config
      mountPath: /etc/idemproxy
      readOnly: true
    {{- if and $v.redis.existingSecret (not $v.postgres.url) }}
    - name: idemproxy-redis
      mountPath: /var/run/secrets/idemproxy-redis
      readOnly: true
    {{- end }}
    {{- if and $v.postgres.url $v.postgres.existingSecret }}
    - name: idemproxy-postgres
      mountPath: /var/run/secrets/idemproxy-postgres
      readOnly: true
    {{- end }}
    {{- if $v.encryption.existingSecret }}
    - name: idemproxy-keys
      mountPath: /var/run/secrets/idemproxy-keys
      readOnly: true
    {{- end }}
    {{- if $v.adminToken.existingSecret }}
    - name: idemproxy-admin
      mountPath: /var/run/secrets/idemproxy-admin
      readOnly: true
    {{- end }}
    {{- with $v.sidecar.extraVolumeMounts }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end -}}

{{/* idemproxy.volumes are the volumes the sidecar mounts. */}}
{{- define "idemproxy.volumes" -}}
{{- $v := .Values -}}
{{- if and (kindIs "map" $v.idemproxy) (hasKey $v.idemproxy "config") -}}{{- $v = $v.idemproxy -}}{{- end -}}
- name: idemproxy-config
  configMap:
    name: {{ include "idemproxy.fullname" . }}-config
{{- if and $v.postgres.url $v.postgres.existingSecret }}
- name: idemproxy-postgres
  secret:
    secretName: {{ $v.postgres.existingSecret }}
    defaultMode: 0440
    items:
      - key: {{ $v.postgres.passwordKey }}
        path: password
{{- end }}
{{- if and $v.redis.existingSecret (not $v.postgres.url) }}
- name: idemproxy-redis
  secret:
    secretName: {{ $v.redis.existingSecret }}
    defaultMode: 0440
    items:
      - key: {{ $v.redis.passwordKey }}
        path: password
      {{- if $v.redis.sentinelPasswordKey }}
      - key: {{ $v.redis.sentinelPasswordKey }}
        path: sentinel-password
      {{- end }}
{{- end }}
{{- if $v.encryption.existingSecret }}
- name: idemproxy-keys
  secret:
    secretName: {{ $v.encryption.existingSecret }}
    defaultMode: 0440
{{- end }}
{{- if $v.adminToken.existingSecret }}
- name: idemproxy-admin
  secret:
    secretName: {{ $v.adminToken.existingSecret }}
    defaultMode: 0440
    items:
      - key: {{ $v.adminToken.key }}
        path: token
{{- end }}
{{- with $v.extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/*
idemproxy.seconds is a Go duration (30s, 2m, 1h30m, 500ms) in whole
seconds, rounded down; idemproxy.claimStuckSeconds is how old a claim may
grow before IdemproxyClaimStuck: upstream.timeout + late_answer_window +
15s to settle, from the config the chart renders.
*/}}
{{- define "idemproxy.seconds" -}}
{{- $ms := 0 -}}
{{- range regexFindAll "[0-9]+(ms|h|m|s)" (toString .) -1 -}}
{{- $n := regexFind "^[0-9]+" . | int -}}
{{- if hasSuffix "ms" . -}}{{- $ms = add $ms $n -}}
{{- else if hasSuffix "h" . -}}{{- $ms = add $ms (mul $n 3600000) -}}
{{- else if hasSuffix "m" . -}}{{- $ms = add $ms (mul $n 60000) -}}
{{- else -}}{{- $ms = add $ms (mul $n 1000) -}}
{{- end -}}
{{- end -}}
{{- div $ms 1000 -}}
{{- end -}}

{{- define "idemproxy.claimStuckSeconds" -}}
{{- $v := .Values -}}
{{- if and (kindIs "map" .Values.idemproxy) (hasKey .Values.idemproxy "config") -}}{{- $v = .Values.idemproxy -}}{{- end -}}
{{- $up := $v.config.upstream | default dict -}}
{{- $timeout := include "idemproxy.seconds" ($up.timeout | default "30s") | int -}}
{{- $late := include "idemproxy.seconds" ($up.late_answer_window | default "5m") | int -}}
{{- add $timeout $late 15 -}}
{{- end -}}

{{/*
idemproxy.gomemlimit is 90% of sidecar.resources.limits.memory, in bytes.
*/}}
{{- define "idemproxy.gomemlimit" -}}
{{- $v := .Values -}}
{{- if and (kindIs "map" .Values.idemproxy) (hasKey .Values.idemproxy "config") -}}{{- $v = .Values.idemproxy -}}{{- end -}}
{{- $limit := toString (required "sidecar.resources.limits.memory is required: GOMEMLIMIT is 90% of it" $v.sidecar.resources.limits.memory) -}}
{{- $n := regexFind "^[0-9]+" $limit -}}
{{- $unit := trimPrefix $n $limit -}}
{{- $mult := get (dict "" 1 "Ki" 1024 "Mi" 1048576 "Gi" 1073741824 "K" 1000 "M" 1000000 "G" 1000000000) $unit -}}
{{- if or (eq $n "") (not $mult) -}}
{{- fail (printf "sidecar.resources.limits.memory %q: want a whole number with Ki, Mi, Gi, K, M or G" $limit) -}}
{{- end -}}
{{- div (mul (atoi $n) $mult 9) 10 -}}
{{- end -}}

{{/*
The sidecar's ports, from config.listen and config.admin_listen of the
values given (the chart's, or a parent chart's .Values.idemproxy): the port
after the last colon: container ports, probes, the Service's target ports
and the NetworkPolicy follow the config, whatever it says.
*/}}
{{- define "idemproxy.httpPort" -}}
{{- regexReplaceAll "^.*:" ((.config | default dict).listen | default ":8080" | toString) "" -}}
{{- end }}
{{- define "idemproxy.adminPort" -}}
{{- regexReplaceAll "^.*:" ((.config | default dict).admin_listen | default ":9090" | toString) "" -}}
{{- end }}

{{/*
idemproxy.needsRelease refuses, at template time, a config that the image
the chart runs (tag) cannot run: keys added by a later release would make
its -check refuse the config and the pod crash-loop. A tag that is not a
release (a digest, a branch) is not checked.
*/}}
{{- define "idemproxy.needsRelease" -}}
{{- $tag := .tag | toString -}}
{{- if regexMatch "^v?[0-9]+\\.[0-9]+\\.[0-9]+$" $tag -}}
{{- $older := semverCompare "<0.8.0-0" (trimPrefix "v" $tag) -}}
{{- $pg := get (get .cfg "store" | default dict) "postgres" | default dict -}}
{{- if and $older (hasKey $pg "listen_url") -}}
{{- fail (printf "store.postgres.listen_url (postgres.listenUrl) needs idemproxy v0.8.0 or later; the chart runs image.tag %s: set image.tag to v0.8.0 or later, or leave it out" $tag) -}}
{{- end -}}
{{- if and $older (eq (int (get (get .cfg "store" | default dict) "record_format" | default 1)) 5) -}}
{{- fail (printf "store.record_format 5 needs idemproxy v0.8.0 or later; the chart runs image.tag %s: set image.tag to v0.8.0 or later, or format 4" $tag) -}}
{{- end -}}
{{- $before09 := semverCompare "<0.9.0-0" (trimPrefix "v" $tag) -}}
{{- range $i, $r := (get .cfg "routes" | default list) -}}
{{- if and $before09 (kindIs "map" $r) (or (hasKey $r "protocol") (hasKey $r "grpc")) -}}
{{- fail (printf "config.routes[%d].protocol (and grpc) needs idemproxy v0.9.0 or later; the chart runs image.tag %s: set image.tag to v0.9.0 or later, or leave them out" $i $tag) -}}
{{- end -}}
{{- if and $older (kindIs "map" $r) (kindIs "map" (get $r "webhook")) (hasKey (get $r "webhook") "events") -}}
{{- fail (printf "config.routes[%d].webhook.events needs idemproxy v0.8.0 or later; the chart runs image.tag %s: set image.tag to v0.8.0 or later, or leave it out" $i $tag) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
