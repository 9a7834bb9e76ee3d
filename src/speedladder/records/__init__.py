"""The typed records of results.json, read and written by the one codec (codec.py).

Every record keeps the field names of the JSON file (docs/results.md), so a
file written by any version of speedladder loads: a field the record does not
know lands in its `extra` and is written back unchanged; a field the file
lacks takes the record's default. Nothing read is lost.

One module per idea: `results` (the run's record and its kind), `rung` (a rung's record, its gates and
prediction), `checks` (each gate's check), `timing` (a rung's windows), `explanation` (a miss profiled),
`model`, `corpus`, `environment`, `machine`, `profile`, `parallel`, `race`, `tune`, `sweep`, and `convert` (the
JSON rules). Every name is importable from here as well.
"""

from __future__ import annotations

from speedladder.codec import EXTRA
from speedladder.models.model_record import ModelRecord, SavedModel
from speedladder.records.checks import (
    Causality,
    Check,
    Differential,
    Distance,
    Equivalence,
    Explanation,
    Fp64,
    Kinks,
    LearnsCheck,
    LossBand,
    ReferenceCost,
    Role,
    TokensToTarget,
    not_applicable,
)
from speedladder.records.convert import from_dict, to_dict
from speedladder.records.corpus_record import CorpusRecord
from speedladder.records.explanation import OpsPerStep, PartMs, ProfiledExplanation, SideMs, TimedSteps
from speedladder.records.header import Environment
from speedladder.records.machine import BusyProcess, MachineLoad
from speedladder.records.parallel_section import (
    Bandwidth,
    KPrediction,
    MeasuredJob,
    ParallelSection,
    ParamCheck,
    Probe,
    ProbeSize,
    SingleProcess,
)
from speedladder.records.profile_summary import (
    CategoryTime,
    MatmulFacts,
    ProfilePrediction,
    ProfileSummary,
    StepFigures,
)
from speedladder.records.race_section import (
    BudgetCheck,
    EqualTokens,
    PairedTest,
    RaceEntry,
    RaceRun,
    RaceSection,
    RaceStage,
)
from speedladder.records.results import Results, RunKind
from speedladder.records.rung_result import Gate, Prediction, RungResult
from speedladder.records.sweep_section import Crossover, SweepPoint, SweepRung, SweepSection, SweepSkip, SweepSummary
from speedladder.records.timing import TimingRecord, WindowRecord
from speedladder.records.tune_section import TuneCandidate, TuneCommands, TuneJudge, TuneSection

__all__ = [
    "EXTRA",
    "Bandwidth",
    "BudgetCheck",
    "BusyProcess",
    "CategoryTime",
    "Causality",
    "Check",
    "CorpusRecord",
    "Crossover",
    "Differential",
    "Distance",
    "Environment",
    "EqualTokens",
    "Equivalence",
    "Explanation",
    "Fp64",
    "Gate",
    "KPrediction",
    "Kinks",
    "LearnsCheck",
    "LossBand",
    "MachineLoad",
    "MatmulFacts",
    "MeasuredJob",
    "ModelRecord",
    "OpsPerStep",
    "PairedTest",
    "ParallelSection",
    "ParamCheck",
    "PartMs",
    "Prediction",
    "Probe",
    "ProbeSize",
    "ProfilePrediction",
    "ProfileSummary",
    "ProfiledExplanation",
    "RaceEntry",
    "RaceRun",
    "RaceSection",
    "RaceStage",
    "ReferenceCost",
    "Results",
    "Role",
    "RunKind",
    "RungResult",
    "SavedModel",
    "SideMs",
    "SingleProcess",
    "StepFigures",
    "SweepPoint",
    "SweepRung",
    "SweepSection",
    "SweepSkip",
    "SweepSummary",
    "TimedSteps",
    "TimingRecord",
    "TokensToTarget",
    "TuneCandidate",
    "TuneCommands",
    "TuneJudge",
    "TuneSection",
    "WindowRecord",
    "from_dict",
    "not_applicable",
    "to_dict",
]
