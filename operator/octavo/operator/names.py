"""The custom resources' API group and version. Nothing is imported here: the `octavo` command builds its
parser (`octavo operator uninstall`'s flags included) from these without the operator's extra dependencies
(kopf, kubernetes, cronsim), so `pip install octavo` without `[operator]` runs `octavo node` and the rest."""

GROUP = "octavo.io"
VERSION = "v1alpha1"
