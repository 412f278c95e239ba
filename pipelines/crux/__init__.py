"""CRUX (retrieval-context evaluation): answerability ratings, Cov / α-nDCG / Den, data building."""

from pipelines.crux.build import BUILD, BUILD_STUDY, crux_build
from pipelines.crux.framework import CRUX, eval_crux
from pipelines.crux.reproduce import REPRODUCE_CRUX, reproduce_crux

STUDIES = [CRUX, BUILD, BUILD_STUDY, REPRODUCE_CRUX]
COMMANDS = {"eval crux": eval_crux, "crux build": crux_build, "reproduce crux": reproduce_crux}
