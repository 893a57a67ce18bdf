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
