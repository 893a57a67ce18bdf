{{/* The chart's name (nameOverride wins). */}}
{{- define "octavo.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{/* The prefix of resource names: the release name, with the chart's name unless the release has it. */}}
{{- define "octavo.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Labels every object of the release carries (app.kubernetes.io/*). Pass (dict "ctx" $ "component" "x"). */}}
{{- define "octavo.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .ctx.Chart.Name .ctx.Chart.Version | replace "+" "_" }}
{{ include "octavo.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/part-of: octavo
{{- end -}}

{{- define "octavo.selectorLabels" -}}
app.kubernetes.io/name: {{ include "octavo.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "octavo.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "octavo.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "octavo.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* The in-release etcd's names. */}}
{{- define "octavo.etcd.name" -}}
{{- printf "%s-etcd" (include "octavo.fullname" .) -}}
{{- end -}}

{{/* The ConfigMap that says where etcd is (key `endpoints`): BookieClusters and the test pod read it. */}}
{{- define "octavo.etcdConfigMap" -}}
{{- printf "%s-etcd-endpoints" (include "octavo.fullname" .) -}}
{{- end -}}

{{- define "octavo.etcdEndpoints" -}}
{{- if .Values.etcd.enabled -}}
{{- $name := include "octavo.etcd.name" . -}}
{{- $endpoints := list -}}
{{- range $i := until (int .Values.etcd.replicas) -}}
{{- $endpoints = append $endpoints (printf "%s-%d.%s-peers.%s.svc:2379" $name $i $name $.Release.Namespace) -}}
{{- end -}}
{{- join "," $endpoints -}}
{{- else -}}
{{- .Values.externalEtcd.endpoints -}}
{{- end -}}
{{- end -}}

{{/*
What values.schema.json cannot say (it checks one value at a time): relations between values. Each failure is
one clear line at `helm install` / `helm template` time.
*/}}
{{- define "octavo.validate" -}}
{{- if and (not .Values.etcd.enabled) (not .Values.externalEtcd.endpoints) -}}
{{- fail "values: etcd.enabled is false, so externalEtcd.endpoints must name etcd (HOST:PORT[,HOST:PORT...])" -}}
{{- end -}}
{{- if and .Values.etcd.enabled .Values.externalEtcd.endpoints -}}
{{- fail "values: set either etcd.enabled or externalEtcd.endpoints, not both" -}}
{{- end -}}
{{- include "octavo.validateTls" . -}}
{{- if and .Values.etcd.enabled (or .Values.externalEtcd.tls.secretName .Values.externalEtcd.credentialsSecret) -}}
{{- fail "values: externalEtcd.tls and externalEtcd.credentialsSecret apply to an external etcd only (etcd.enabled is true: with tls.enabled the release's etcd uses the chart's certificates)" -}}
{{- end -}}
{{- $c := .Values.bookieCluster -}}
{{- if and $c.create (lt (int $c.replicas) (int $c.minWritableBookies)) -}}
{{- fail (printf "values: bookieCluster.replicas (%d) is below bookieCluster.minWritableBookies (%d): new ledgers could not find their ensemble" (int $c.replicas) (int $c.minWritableBookies)) -}}
{{- end -}}
{{- $p := .Values.compactionPolicy -}}
{{- if $p.create -}}
{{- if not (lt (float64 $p.writableRatio) (float64 $p.readOnlyRatio)) -}}
{{- fail (printf "values: compactionPolicy.writableRatio (%v) must be below compactionPolicy.readOnlyRatio (%v): a bookie is released only well below where it was forced read-only" $p.writableRatio $p.readOnlyRatio) -}}
{{- end -}}
{{- if gt (float64 $p.warnRatio) (float64 $p.readOnlyRatio) -}}
{{- fail (printf "values: compactionPolicy.warnRatio (%v) must not be above compactionPolicy.readOnlyRatio (%v)" $p.warnRatio $p.readOnlyRatio) -}}
{{- end -}}
{{- if gt (float64 $p.minorThreshold) (float64 $p.majorThreshold) -}}
{{- fail (printf "values: compactionPolicy.minorThreshold (%v) must not be above compactionPolicy.majorThreshold (%v)" $p.minorThreshold $p.majorThreshold) -}}
{{- end -}}
{{- end -}}
{{- if gt (int .Values.operator.replicas) 1 -}}
{{- range .Values.operator.watchNamespaces -}}
{{- if contains "*" . -}}
{{- fail (printf "values: operator.replicas > 1 elects its active pod in a KopfPeering per namespace, which the chart cannot create for the glob %q: list the namespaces by name, or run one replica" .) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $t := .Values.tests -}}
{{- if and $t.enabled $c.create -}}
{{- if not (and (le (int $t.ackQuorum) (int $t.writeQuorum)) (le (int $t.writeQuorum) (int $t.ensembleSize))) -}}
{{- fail (printf "values: tests need ackQuorum (%d) <= writeQuorum (%d) <= ensembleSize (%d)" (int $t.ackQuorum) (int $t.writeQuorum) (int $t.ensembleSize)) -}}
{{- end -}}
{{- if and $c.create (gt (int $t.ensembleSize) (int $c.replicas)) -}}
{{- fail (printf "values: tests.ensembleSize (%d) is above bookieCluster.replicas (%d): the test ledger could not be created" (int $t.ensembleSize) (int $c.replicas)) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The example cluster's name in etcd (spec.clusterName, else its name). */}}
{{- define "octavo.clusterName" -}}
{{- default .Values.bookieCluster.name .Values.bookieCluster.clusterName -}}
{{- end -}}

{{/* The operator's peering name (only with more than one replica). */}}
{{- define "octavo.peeringName" -}}
{{- include "octavo.fullname" . -}}
{{- end -}}

{{/* -- TLS (docs/security.md) ----------------------------------------------------------------------------- */}}

{{/* A role's certificate Secret: the chart's cert-manager Certificate writes it, else the one given in values.
Pass (dict "ctx" $ "role" "bookie"|"operator"|"client"|"etcd"). */}}
{{- define "octavo.tlsSecret" -}}
{{- $t := .ctx.Values.tls -}}
{{- if $t.certManager.enabled -}}
{{- printf "%s-%s-tls" (include "octavo.fullname" .ctx) .role -}}
{{- else -}}
{{- include "octavo.validateTls" .ctx -}}
{{- $given := get $t (printf "%sSecret" .role) -}}
{{- required (printf "tls.%sSecret is required when tls.enabled is true and tls.certManager.enabled is false: a kubernetes.io/tls Secret with ca.crt" .role) $given -}}
{{- end -}}
{{- end -}}

{{/* The Secret a process uses to reach etcd over TLS: its own certificate with the in-release etcd (one CA),
externalEtcd.tls.secretName with an external etcd; empty: plaintext. Pass (dict "ctx" $ "role" ...). */}}
{{- define "octavo.etcdTlsSecret" -}}
{{- if .ctx.Values.etcd.enabled -}}
{{- if .ctx.Values.tls.enabled -}}{{- include "octavo.tlsSecret" . -}}{{- end -}}
{{- else -}}
{{- .ctx.Values.externalEtcd.tls.secretName -}}
{{- end -}}
{{- end -}}

{{- define "octavo.etcdClientCertificate" -}}
{{- if .Values.etcd.enabled -}}true{{- else -}}{{- .Values.externalEtcd.tls.clientCertificate -}}{{- end -}}
{{- end -}}

{{/* The etcd credentials Secret (username, password): only for an external etcd with authentication. */}}
{{- define "octavo.etcdCredentialsSecret" -}}
{{- if not .Values.etcd.enabled -}}{{- .Values.externalEtcd.credentialsSecret -}}{{- end -}}
{{- end -}}

{{/* Environment of a process of the release that talks to bookies and etcd (the operator, the test pod):
OCTAVO_TLS_* and OCTAVO_ETCD_* naming files in the volumes of octavo.security.volumes. */}}
{{- define "octavo.security.env" -}}
{{- if .ctx.Values.tls.enabled }}
- {name: OCTAVO_TLS_CA_FILE, value: /etc/octavo-tls/ca.crt}
- {name: OCTAVO_TLS_CERT_FILE, value: /etc/octavo-tls/tls.crt}
- {name: OCTAVO_TLS_KEY_FILE, value: /etc/octavo-tls/tls.key}
{{- end }}
{{- if include "octavo.etcdTlsSecret" . }}
- {name: OCTAVO_ETCD_TLS_CA_FILE, value: /etc/octavo-etcd-tls/ca.crt}
{{- if eq (include "octavo.etcdClientCertificate" .ctx) "true" }}
- {name: OCTAVO_ETCD_TLS_CERT_FILE, value: /etc/octavo-etcd-tls/tls.crt}
- {name: OCTAVO_ETCD_TLS_KEY_FILE, value: /etc/octavo-etcd-tls/tls.key}
{{- end }}
{{- end }}
{{- with include "octavo.etcdCredentialsSecret" .ctx }}
- name: OCTAVO_ETCD_USERNAME
  valueFrom: {secretKeyRef: {name: {{ . }}, key: username}}
- {name: OCTAVO_ETCD_PASSWORD_FILE, value: /etc/octavo-etcd-credentials/password}
{{- end }}
{{- end -}}

{{- define "octavo.security.mounts" -}}
{{- if .ctx.Values.tls.enabled }}
- {name: tls, mountPath: /etc/octavo-tls, readOnly: true}
{{- end }}
{{- if include "octavo.etcdTlsSecret" . }}
- {name: etcd-tls, mountPath: /etc/octavo-etcd-tls, readOnly: true}
{{- end }}
{{- if include "octavo.etcdCredentialsSecret" .ctx }}
- {name: etcd-credentials, mountPath: /etc/octavo-etcd-credentials, readOnly: true}
{{- end }}
{{- end -}}

{{/* Mounted as directories (no subPath): the kubelet updates renewed certificates in place. */}}
{{- define "octavo.security.volumes" -}}
{{- if .ctx.Values.tls.enabled }}
- name: tls
  secret: {secretName: {{ include "octavo.tlsSecret" . }}, defaultMode: 0440}
{{- end }}
{{- with include "octavo.etcdTlsSecret" . }}
- name: etcd-tls
  secret: {secretName: {{ . }}, defaultMode: 0440}
{{- end }}
{{- with include "octavo.etcdCredentialsSecret" .ctx }}
- name: etcd-credentials
  secret: {secretName: {{ . }}, defaultMode: 0440, items: [{key: password, path: password}]}
{{- end }}
{{- end -}}

{{/* Without cert-manager every Secret the release mounts must be named (one message listing them all). */}}
{{- define "octavo.validateTls" -}}
{{- $t := .Values.tls -}}
{{- if and $t.enabled (not $t.certManager.enabled) -}}
{{- $missing := list -}}
{{- if and .Values.bookieCluster.create (not $t.bookieSecret) -}}{{- $missing = append $missing "tls.bookieSecret" -}}{{- end -}}
{{- if not $t.operatorSecret -}}{{- $missing = append $missing "tls.operatorSecret" -}}{{- end -}}
{{- if and (or .Values.tests.enabled $t.metrics) (not $t.clientSecret) -}}{{- $missing = append $missing "tls.clientSecret" -}}{{- end -}}
{{- if and .Values.etcd.enabled (not $t.etcdSecret) -}}{{- $missing = append $missing "tls.etcdSecret" -}}{{- end -}}
{{- if $missing -}}
{{- fail (printf "values: tls.enabled without tls.certManager.enabled needs your certificate Secrets (kubernetes.io/tls with ca.crt): %s not set" (join ", " $missing)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
