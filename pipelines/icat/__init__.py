"""ICAT (Samarinas et al.): factuality and aspect coverage of long-form answers."""

from pipelines.icat.framework import ICAT, IcatOptions, eval_icat
from pipelines.icat.human import meta_eval_icat
from pipelines.icat.reproduce import REPRODUCE_ICAT, reproduce_icat

STUDIES = [ICAT, REPRODUCE_ICAT]
COMMANDS = {
    "eval icat": eval_icat,
    "meta-eval icat": meta_eval_icat,
    "reproduce icat": reproduce_icat,
}

__all__ = ["ICAT", "IcatOptions", "STUDIES", "COMMANDS"]
