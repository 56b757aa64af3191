{{/* Names and labels. */}}
{{- define "idemproxy.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "idemproxy.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "idemproxy.selectorLabels" -}}
app.kubernetes.io/name: {{ include "idemproxy.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
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
{{- $cfg := deepCopy .Values.config -}}
{{- $store := get $cfg "store" | default dict -}}
{{- $redis := dict "addrs" .Values.redis.addrs -}}
{{- if eq .Values.redis.mode "sentinel" -}}
{{- $_ := set $redis "master_name" (required "redis.masterName is required with redis.mode sentinel" .Values.redis.masterName) -}}
{{- else if not (has .Values.redis.mode (list "standalone" "cluster")) -}}
{{- fail (printf "redis.mode must be standalone, sentinel or cluster, got %q" .Values.redis.mode) -}}
{{- end -}}
{{- if and (eq .Values.redis.mode "standalone") (ne (len .Values.redis.addrs) 1) -}}
{{- fail "redis.mode standalone takes exactly one address in redis.addrs" -}}
{{- end -}}
{{- if .Values.redis.existingSecret -}}
{{- $_ := set $redis "password_file" "/var/run/secrets/idemproxy-redis/password" -}}
{{- if .Values.redis.sentinelPasswordKey -}}
{{- $_ := set $redis "sentinel_password_file" "/var/run/secrets/idemproxy-redis/sentinel-password" -}}
{{- end -}}
{{- end -}}
{{- $_ := set $store "redis" $redis -}}
{{- if .Values.encryption.existingSecret -}}
{{- $files := list -}}
{{- range .Values.encryption.keys -}}
{{- $files = append $files (printf "/var/run/secrets/idemproxy-keys/%s" .) -}}
{{- end -}}
{{- $_ := set $store "encryption" (dict "key_files" $files "required" .Values.encryption.required) -}}
{{- if .Values.encryption.keySecretKey -}}
{{- $_ := set $store "key_secret_file" (printf "/var/run/secrets/idemproxy-keys/%s" .Values.encryption.keySecretKey) -}}
{{- end -}}
{{- end -}}
{{- $_ := set $cfg "store" $store -}}
{{- if .Values.adminToken.existingSecret -}}
{{- $_ := set $cfg "admin" (dict "token_file" "/var/run/secrets/idemproxy-admin/token") -}}
{{- end -}}
{{- toYaml $cfg -}}
{{- end -}}

{{/*
idemproxy.sidecar renders the sidecar container. Put it under
initContainers (a native sidecar, Kubernetes >= 1.29: it starts before the
app and stops after it), with the volumes of "idemproxy.volumes":

  initContainers:
    {{- include "idemproxy.sidecar" . | nindent 4 }}
  volumes:
    {{- include "idemproxy.volumes" . | nindent 4 }}

It reads .Values.image, .Values.sidecar, .Values.redis,
.Values.encryption and .Values.adminToken of the chart that includes it.
*/}}
{{- define "idemproxy.sidecar" -}}
- name: idemproxy
  image: "{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}"
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  restartPolicy: Always
  args: ["-config", "/etc/idemproxy/config.yaml"]
  ports:
    - name: http
      containerPort: 8080
    - name: admin
      containerPort: 9090
  env:
    # The Go GC works harder as the heap nears the container's limit
    # instead of letting a burst of large bodies end in an OOM kill.
    - name: GOMEMLIMIT
      valueFrom:
        resourceFieldRef:
          containerName: idemproxy
          resource: limits.memory
    # Bounded by GOMEMLIMIT, a less frequent GC costs 6-11% less CPU per
    # request for ~12 MiB (docs/operations.md, Memory).
    - name: GOGC
      value: "400"
    {{- with .Values.sidecar.env }}
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
    {{- toYaml .Values.sidecar.resources | nindent 4 }}
  securityContext:
    runAsNonRoot: true
    runAsUser: 65532
    runAsGroup: 65532
    readOnlyRootFilesystem: true
    allowPrivilegeEscalation: false
    capabilities:
      drop: ["ALL"]
  volumeMounts:
    - name: idemproxy-config
      mountPath: /etc/idemproxy
      readOnly: true
    {{- if .Values.redis.existingSecret }}
    - name: idemproxy-redis
      mountPath: /var/run/secrets/idemproxy-redis
      readOnly: true
    {{- end }}
    {{- if .Values.encryption.existingSecret }}
    - name: idemproxy-keys
      mountPath: /var/run/secrets/idemproxy-keys
      readOnly: true
    {{- end }}
    {{- if .Values.adminToken.existingSecret }}
    - name: idemproxy-admin
      mountPath: /var/run/secrets/idemproxy-admin
      readOnly: true
    {{- end }}
{{- end -}}

{{/* idemproxy.volumes are the volumes the sidecar mounts. */}}
{{- define "idemproxy.volumes" -}}
- name: idemproxy-config
  configMap:
    name: {{ include "idemproxy.fullname" . }}-config
{{- if .Values.redis.existingSecret }}
- name: idemproxy-redis
  secret:
    secretName: {{ .Values.redis.existingSecret }}
    defaultMode: 0440
    items:
      - key: {{ .Values.redis.passwordKey }}
        path: password
      {{- if .Values.redis.sentinelPasswordKey }}
      - key: {{ .Values.redis.sentinelPasswordKey }}
        path: sentinel-password
      {{- end }}
{{- end }}
{{- if .Values.encryption.existingSecret }}
- name: idemproxy-keys
  secret:
    secretName: {{ .Values.encryption.existingSecret }}
    defaultMode: 0440
{{- end }}
{{- if .Values.adminToken.existingSecret }}
- name: idemproxy-admin
  secret:
    secretName: {{ .Values.adminToken.existingSecret }}
    defaultMode: 0440
    items:
      - key: {{ .Values.adminToken.key }}
        path: token
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
{{- $up := .Values.config.upstream | default dict -}}
{{- $timeout := include "idemproxy.seconds" ($up.timeout | default "30s") | int -}}
{{- $late := include "idemproxy.seconds" ($up.late_answer_window | default "5m") | int -}}
{{- add $timeout $late 15 -}}
{{- end -}}
