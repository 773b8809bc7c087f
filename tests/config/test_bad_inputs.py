"""Every bad input ends a recipe with exit code 2 and one line on stderr, ``lit_fedco: KEY: ...``,
naming the key, the value, what was expected and how to fix it, before any process starts or
file is written (issue 11): command-line syntax, presets, Fabric settings, data files that
decode to nonsense, W&B, schedule and partition ranges, run folders.

Most cases call :func:`lit_fedco.experiment.runner.main` in this process; a few run the recipe as a real
process (``slow``): a malformed list, a missing GPU, W&B online without a server (and its
offline fallback), labels outside the classes.
"""

from __future__ import annotations

import gzip
import importlib
import os
import pickle
import re
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from lit_fedco.cli import run as main
from lit_fedco.config import catalog
from tests.helpers import REPO, override

BASE = ["progress=false", "rounds=2", "eval_every=1"]  # a case that passed would run briefly
MNIST = ["data.name=mnist", "data.big=50", "data.small=10", "data.val_per_client=5"]
CIFAR = ["data.name=cifar10", "data.big=50", "data.small=10", "data.val_per_client=5"]
UNREACHABLE = {"WANDB_API_KEY": "x" * 40, "WANDB_BASE_URL": "http://127.0.0.1:9"}  # port 9 closed
NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible")
NO_MPS = pytest.mark.skipif(torch.backends.mps.is_available(), reason="MPS is available")


def case(cid: str, argv: list[str], pattern: str, env=None, recipe="comfedl_dro", marks=()):
    return pytest.param(recipe, argv, pattern, env or {}, id=cid, marks=marks)


# (id, argv, regex of the one line after "lit_fedco: "); {d} is the folder of bad data files
CASES = [
    # --- command line and presets
    case("seeds-unclosed", ["seeds=[0,1"], r"seeds: got '\[0,1' .*does not parse.*seeds=\[0,1,2\]"),
    case("updaters-unclosed", ["updaters=[fedavg"], r"updaters: got '\[fedavg' .*brackets closed"),
    case("tracking-no-brackets", ["tracking=wandb,csv"], r"tracking: got 'wandb,csv' .*a list in brackets; set e\.g\. tracking=\[wandb,csv\]"),
    case("seed-letters", ["seeds=[a,b]"], r"seeds\[0\]: got 'a' .*type int; set e\.g\. seeds="),
    case("rounds-list", ["rounds=[1,2]"], r"rounds: got \[1, 2\] .*type int"),
    case("rounds-float", ["rounds=1.5"], r"rounds: got 1\.5 .*type int"),
    case("rounds-empty", ["rounds="], r"rounds: got '' .*type int"),
    case("progress-not-bool", ["progress=maybe"], r"progress: got 'maybe' .*true or false"),
    case("group-as-value", ["data=3"], r"data: got 3 .*a group of keys.*set e\.g\. data\.name="),
    case("list-as-mapping", ["updaters={a: 1}"], r"updaters: got \{'a': 1\} .*a list in brackets"),
    case("nested-list", ["seeds=[[1]]"], r"seeds: got \[\[1\]\], expected a list of single values"),
    case("interpolation", ["rounds=${nope}"], r"rounds: got '\$\{nope\}', expected .*interpolation that resolves"),
    case("no-key", ["=3"], r"command line: got '=3', expected key=value"),
    case("unknown-key", ["roundz=3"], r"roundz: unknown config key .*did you mean 'rounds'"),
    case("unknown-updater", ["updater=comfed"], r"updater: got 'comfed', expected one of .*comfedl"),
    case("preset-malformed", ["preset={d}/bad.yaml"], r"preset: .*bad\.yaml is not a readable YAML mapping \(.* at line 2, column 1\)"),
    case("preset-unknown-key", ["preset={d}/unknown.yaml"], r"roundz: unknown config key \(from preset .*unknown\.yaml\)"),
    case("preset-bad-type", ["preset={d}/badtype.yaml"], r"rounds: got 'abc' \(from preset .*\), expected a value of type int"),
    case("preset-null", ["preset={d}/null.yaml"], r"rounds: got None \(from preset .*\), expected .*not empty or null"),
    case("preset-group-as-value", ["preset={d}/badnest.yaml"], r"data: got 3 \(from preset .*a group of keys"),
    case("preset-empty", ["preset={d}/empty.yaml"], r"preset: .*empty\.yaml is empty, expected a mapping"),
    case("preset-missing", ["preset=nope"], r"preset: got 'nope', no such file"),
    # --- Fabric
    case("accelerator-gpu", ["accelerator=gpu"], r"accelerator: got 'gpu', but torch sees no GPU device.*set accelerator=cpu", marks=NO_GPU),
    case("accelerator-cuda", ["accelerator=cuda"], r"accelerator: got 'cuda', but torch sees no CUDA", marks=NO_GPU),
    case("accelerator-mps", ["accelerator=mps"], r"accelerator: got 'mps', but torch sees no MPS", marks=NO_MPS),
    case("accelerator-tpu", ["accelerator=tpu"], r"accelerator: got 'tpu', expected one of .*'cpu'"),
    case("accelerator-bogus", ["accelerator=bogus"], r"accelerator: got 'bogus', expected one of"),
    case("strategy-bogus", ["strategy=bogus"], r"strategy: got 'bogus', expected one of \('auto', 'ddp'\)"),
    case("strategy-fsdp", ["strategy=fsdp"], r"strategy: got 'fsdp', expected one of"),
    case("strategy-dp", ["strategy=dp"], r"strategy: got 'dp', expected one of"),
    case("devices-0", ["devices=0"], r"devices: got 0, expected an int >= 1"),
    case("num-nodes-0", ["num_nodes=0"], r"num_nodes: got 0, expected an int >= 1"),
    case("num-nodes-2-alone", ["num_nodes=2", "cohort=10"], r"num_nodes: got 2, expected 1 outside a multi-node environment"),
    case("devices-over-cohort", ["devices=4", "cohort=2"], r"cohort: got 2, expected at least the number of processes \(4\)"),
    case("master-port-bogus", ["devices=2"], r"MASTER_PORT: got 'abc', expected a TCP port", {"MASTER_PORT": "abc"}),
    case("master-port-busy", ["devices=2"], r"MASTER_PORT: got '\d+', but the port cannot be used", {"MASTER_PORT": "BUSY"}),
    case("no-precision-key", ["precision=16"], r"precision: unknown config key"),
    # --- data that decode to nonsense
    case("idx-label-12", [*MNIST, "data.data_dir={d}/mnist_label12"], r"data\.data_dir: got '.*mnist_label12', whose mnist training labels include 12 .*expected class labels in \[0, 10\)"),
    case("idx-truncated", [*MNIST, "data.data_dir={d}/mnist_trunc"], r"data\.data_dir: got '.*mnist_trunc', whose mnist files .* could not be read as IDX"),
    case("idx-gz-truncated", [*MNIST, "data.data_dir={d}/mnist_gz_trunc"], r"data\.data_dir: got .*could not be read as IDX \(EOFError"),
    case("idx-16x16", [*MNIST, "data.data_dir={d}/mnist_16"], r"data\.data_dir: got .*training images have shape \[1, 16, 16\], expected \[1, 28, 28\]"),
    case("idx-test-16x16", [*MNIST, "data.data_dir={d}/mnist_mixed"], r"data\.data_dir: got .*held-out images have shape \[1, 16, 16\]"),
    case("idx-no-images", [*MNIST, "data.data_dir={d}/mnist_zero"], r"data\.data_dir: got .*could not be read as IDX"),
    case("idx-swapped", [*MNIST, "data.data_dir={d}/mnist_swapped"], r"data\.data_dir: got .*could not be read as IDX"),
    case("empty-data-folder", [*MNIST, "data.data_dir={d}/empty"], r"data\.data_dir: got '.*empty', expected the mnist training files"),
    case("data-dir-is-a-file", [*MNIST, "data.data_dir={d}/afile"], r"data\.data_dir: got '.*afile', expected the mnist"),
    case("cifar-label-10", [*CIFAR, "data.data_dir={d}/cifar_label10"], r"data\.data_dir: got .*cifar10 training labels include 10 .*\[0, 10\)"),
    case("cifar-label-negative", [*CIFAR, "data.data_dir={d}/cifar_labelneg"], r"data\.data_dir: got .*labels include -1"),
    case("cifar-not-a-dict", [*CIFAR, "data.data_dir={d}/cifar_list"], r"data\.data_dir: got .*python-format files .*TypeError"),
    case("cifar-wrong-row-size", [*CIFAR, "data.data_dir={d}/cifar_cols"], r"data\.data_dir: got .*cannot reshape"),
    case("cifar100-label-100", ["data.name=cifar100_st", "data.num_clients=2", "cohort=2", "data.val_per_client=1", "data.data_dir={d}/cifar100_label100"], r"data\.data_dir: got .*cifar100 training labels include 100", recipe="ds_feddro"),
    case("omniglot-empty", ["data.name=omniglot", "data.data_dir={d}/omniglot_empty"], r"data\.data_dir: got .*images_background holds no images", recipe="fcsg_maml"),
    # --- W&B (in this process: no W&B run is started)
    case("wandb-online-no-server", ["tracking=[wandb]"], r"WANDB_MODE: got 'online', but the W&B server http://127\.0\.0\.1:9 cannot be reached within 3 s .*WANDB_MODE=offline", {"WANDB_MODE": "online", **UNREACHABLE}),
    case("wandb-online-no-key", ["tracking=[wandb]"], r"WANDB_MODE: got 'online', but no W&B credentials", {"WANDB_MODE": "online"}),
    case("wandb-mode-bogus", ["tracking=[wandb]"], r"WANDB_MODE: got 'bogus', expected one of", {"WANDB_MODE": "bogus"}),
    case("wandb-base-url", ["tracking=[wandb]"], r"WANDB_BASE_URL: got 'not a url', expected the http\(s\) URL", {"WANDB_MODE": "offline", "WANDB_BASE_URL": "not a url"}),
    case("wandb-project", ["tracking=[wandb]", "project=a/b"], r"project: got 'a/b', expected a W&B project name", {"WANDB_MODE": "offline"}),
    case("tracking-bogus", ["tracking=[wandbb]"], r"tracking: got 'wandbb'"),
    case("tracking-none-and-csv", ["tracking=[none,csv]"], r"tracking: got \['none', 'csv'\], expected 'none' alone"),
    # --- what runs, the schedule, execution
    case("updaters-empty", ["updaters=[]"], r"updaters: got \[\], expected at least one updater"),
    case("updater-empty", ["updater="], r"updaters: got \[\], expected at least one updater"),
    case("updaters-repeated", ["updaters=[fedavg,fedavg]"], r"updaters: got \['fedavg', 'fedavg'\], .*each once"),
    case("seeds-repeated", ["seeds=[0,0]"], r"seeds: got \[0, 0\], expected distinct seeds"),
    case("seed-negative", ["seed=-1"], r"seed: got -1, expected an int >= 0"),
    case("seeds-negative", ["seeds=[-1]"], r"seeds: got \[-1\], expected ints >= 0"),
    case("rounds-0", ["rounds=0"], r"rounds: got 0, expected an int >= 1"),
    case("cohort-0", ["cohort=0"], r"cohort: got 0, expected an int in \[1, 10\]"),
    case("cohort-over-clients", ["cohort=50"], r"cohort: got 50, expected an int in \[1, 10\]"),
    case("batch-size-0", ["batch_size=0"], r"batch_size: got 0, expected an int >= 1"),
    case("eval-every-0", ["eval_every=0"], r"eval_every: got 0, expected an int >= 1"),
    case("local-steps-0", ["local_steps=0"], r"local_steps: got 0, expected an int >= 1"),
    case("dtype-float16", ["dtype=float16"], r"dtype: got 'float16', expected one of"),
    case("executor-bogus", ["executor=bogus"], r"executor: got 'bogus', expected one of"),
    case("chunk-size-negative", ["chunk_size=-1"], r"chunk_size: got -1, expected an int >= 0"),
    case("threads-negative", ["threads=-1"], r"threads: got -1, expected an int in \[0, \d+\] \(0: the cores shared out"),
    case("objective-bogus", ["objective=bogus"], r"objective: got 'bogus', expected one of"),
    case("objective-for-updater", ["objective=auprc", "updater=feddro"], r"objective=auprc offers .*needs one of \['distributed'\].*\(in updater 'feddro'\)"),
    case("variant-unknown-key", ["variants=[roundz=3]"], r"roundz: unknown config key .*\(in variants\[0\] 'roundz=3'\)"),
    case("variant-bad-value", ["variants=[rounds=-1]"], r"rounds: got -1, expected an int >= 1; .*\(in variant 'rounds=-1'\)"),
    case("variant-unclosed-quote", ["variants=['rounds=\"2']"], r"variants\[0\]: got 'rounds=\"2', which does not split"),
    case("lr-negative", ["comfedl.lr=-1"], r"comfedl\.lr: got -1\.0, expected a float > 0"),
    case("gamma-0", ["client_dro.gamma=0"], r"client_dro\.gamma: got 0\.0, expected a float > 0"),
    case("failures-drop", ["failures.drop=1.5"], r"failures\.drop: got 1\.5, expected a float in \[0, 1\]"),
    # --- model and partition
    case("model-bogus", ["model.name=bogus"], r"model\.name: got 'bogus', expected one of"),
    case("model-hidden-0", ["model.name=mlp", "model.hidden=0"], r"model\.hidden: got 0, expected an int >= 1"),
    case("clients-over-samples", ["data.partition=iid", "data.num_clients=5000", "cohort=5"], r"data\.num_clients: got 5000, expected at most the \d+ samples"),
    case("clients-0", ["data.num_clients=0"], r"data\.num_clients: got 0, expected an int >= 1"),
    case("alpha-0", ["data.partition=dirichlet", "data.alpha=0"], r"data\.alpha: got 0\.0, expected a float > 0"),
    case("rho-1.5", ["data.partition=dominant_class", "data.rho=1.5"], r"data\.rho: got 1\.5, expected a float in \(0, 1\)"),
    case("big-over-pool", ["data.big=100000"], r"data\.big: got 100000, expected big \+ .*<= \d+ samples"),
    case("data-name-bogus", ["data.name=cifar7"], r"data\.name: got 'cifar7', expected one of"),
    case("auprc-client-without-positives", ["data.drop_positive=0.99"], r"auprc: client 0 holds no positive sample; use fewer clients", recipe="fcsg_auprc"),
    case("shard-data-not-bool", ["shard_data=maybe"], r"shard_data: got 'maybe' .*true or false"),
    case("imbalance-ratio", ["data.imbalance_ratio=0.5"], r"data\.imbalance_ratio: got 0\.5, expected a float >= 1", recipe="ds_feddro"),
    case("classes-without-client", ["data.classes_per_client=1", "data.num_clients=3", "cohort=3"], r"data\.classes_per_client: got 1, expected at least 10, so that each of the 28 classes has a client", recipe="fcsg_maml"),
    case("more-clients-than-classes", ["data.classes_per_client=0", "data.num_clients=40", "cohort=4"], r"data\.classes_per_client: got 0, expected an int >= 1: the 28 training classes cannot be shared out disjointly over 40 clients", recipe="fcsg_maml"),
    case("rotations-5", ["data.rotations=5"], r"data\.rotations: got 5, expected 1, 2, 3 or 4", recipe="fcsg_maml"),
    # --- run folders
    case("out-dir-empty", ["out_dir="], r"out_dir: got '', expected a folder"),
    case("out-dir-is-a-file", ["out_dir={d}/afile"], r"out_dir: got '.*afile', expected a folder, but .* is a file"),
    case("run-name-slash", ["run_name=a/b"], r"run_name: got 'a/b', expected a folder name"),
    case("resume-auto-no-name", ["resume=auto"], r"resume: got 'auto' without run_name"),
    case("resume-missing-file", ["resume=/nonexistent.ckpt", "updater=fedavg", "seeds=[0]"], r"resume: cannot read /nonexistent\.ckpt"),
    case("checkpoint-every-negative", ["checkpoint_every=-1"], r"checkpoint_every: got -1, expected an int >= 0"),
    case("checkpoint-keep-0", ["checkpoint_keep=0"], r"checkpoint_keep: got 0, expected an int >= 1"),
    # --- misuse that once ran, or crashed (issue 19)
    case("variant-seeds", ['variants=["seeds=[5]"]'], r"variants\[0\]: sets seeds=\[5\], a key of the whole run"),
    case("variant-seed", ["variants=[seed=3]"], r"variants\[0\]: sets seed=3, a key of the whole run"),
    case("variant-run-name", ["variants=[run_name=x]"], r"variants\[0\]: sets run_name='x', a key of the whole run"),
    case("variant-resume", ["variants=[resume=auto]"], r"variants\[0\]: sets resume='auto', a key of the whole run"),
    case("variant-devices", ["variants=[devices=2]"], r"variants\[0\]: sets devices=2, a key of the whole run"),
    case("variant-out-dir", ["variants=[out_dir=elsewhere]"], r"variants\[0\]: sets out_dir='elsewhere', a key of the whole run"),
    case("explicit-vectorized-unvmappable", ["updater=comfedl_maml", "executor=vectorized"], r"executor: got 'vectorized', but comfedl_maml cannot run under vmap on model.name=conv4", recipe="comfedl_maml"),
    case("seed-2-64", ["seeds=[18446744073709551616]"], r"seeds: got 18446744073709551616, expected an int of at most 64 bits"),
    case("seed-2-32", ["seeds=[4294967296]"], r"seeds: got \[4294967296\], expected ints in \[0, 2\^32\)"),
    case("run-name-300", ["run_name=" + "x" * 300], r"run_name: got 'x+…', expected at most 200 bytes, got 300"),
    case("run-name-newline", ["run_name=a\nb"], r"run_name: got 'a\\nb', expected a value on one line"),
    case("run-name-hidden", ["run_name=.x"], r"run_name: got '.x', expected a folder name that does not start with '.'"),
    case("out-dir-recipe-is-a-file", ["out_dir={d}/recipe_file"], r"out_dir: got '.*recipe_file', expected a folder, but .*recipe_file/comfedl_dro is a file"),
    case("out-dir-link-loop", ["out_dir={d}/loop/a"], r"out_dir: got '.*loop/a', expected a folder that resolves \(Symlink loop"),
    case("threads-huge", ["threads=1000000"], r"threads: got 1000000, expected an int in \[0, \d+\]"),
    case("lr-inf", ["comfedl.lr=.inf"], r"comfedl.lr: got inf, expected a finite number; set e\.g\. comfedl.lr="),
    case("lr-1e309", ["comfedl.lr=1e309"], r"comfedl.lr: got inf, expected a finite number"),
    case("gamma-inf", ["client_dro.gamma=.inf"], r"client_dro.gamma: got inf, expected a finite number"),
    case("lr-nan", ["comfedl.lr=.nan"], r"comfedl.lr: got nan, expected a finite number"),
    case("rounds-huge", ["rounds=99999999999999999999"], r"rounds: got 99999999999999999999, expected an int of at most 64 bits"),
    case("drop-1", ["failures.drop=1.0"], r"failures.drop: got 1.0, expected a float in \[0, 1\) \(at 1 every client drops out"),
    case("data-dir-embedded", ["data.data_dir=/nonexistent"], r"data.data_dir: got '/nonexistent', but data.name=digits is embedded and reads no folder"),
    case("rounds-twice", ["rounds=5", "rounds=3"], r"rounds: given twice \('rounds=5', then 'rounds=3'\); give it once"),
    # --- near misses (issue 33): the key under its node, the cohort with the clients
    case("lr-without-its-updater", ["lr=0.1"], r"lr: unknown config key \(from the command line\); did you mean 'comfedl\.lr'\? \(each updater of this run has its own: comfedl\.lr, drfl\.lr, qfedavg\.lr, fedavg\.lr"),
    case("variants-repeated", ["variants=[rounds=3,rounds=3]"], r"variants: got variants\[0\] 'rounds=3' and variants\[1\] 'rounds=3', which run the same config, expected distinct variants"),
    case("variants-same-config", ["variants=['rounds=3 seed=0',rounds=3]"], r"variants: got variants\[0\] 'rounds=3 seed=0' and variants\[1\] 'rounds=3', which run the same config"),
    case("server-opt-lbfgs", ["server_opt.name=LBFGS"], r"server_opt\.name: got 'LBFGS', expected empty, one of \[.*\] or a torch\.optim class that steps on dense pseudo-gradients of any shape without a closure \(ASGD, .*Adam, .*SGD\)"),
    case("server-opt-sparse-adam", ["server_opt.name=SparseAdam"], r"server_opt\.name: got 'SparseAdam', expected empty"),
    case("server-opt-muon", ["server_opt.name=Muon"], r"server_opt\.name: got 'Muon', expected empty"),
    case("batch-size-absurd", ["batch_size=1000000000"], r"batch_size: got 1000000000, expected an int in \[1, \d+\] \(the training rows of all the clients together"),
    case("resume-dev-zero", ["resume=/dev/zero", "updater=fedavg", "seeds=[0]"], r"resume: /dev/zero is not a regular file \(a device, FIFO or socket\), expected a checkpoint file"),
    case("resume-fifo", ["resume={d}/fifo", "updater=fedavg", "seeds=[0]"], r"resume: .*/fifo is not a regular file \(a device, FIFO or socket\)"),
    case("resume-folder", ["resume={d}/empty", "updater=fedavg", "seeds=[0]"], r"resume: .*/empty is a folder, expected a checkpoint file"),
    case("init-from-urandom", ["init_from=/dev/urandom"], r"init_from: /dev/urandom is not a regular file \(a device, FIFO or socket\)"),
    case("run-dir-env-by-hand", [], r"LIT_FEDCO_RUN_DIR: got '/tmp/another-run', but this process was not started by the run that set it \(LIT_FEDCO_RUN_OWNER=unset, parent \d+\); unset LIT_FEDCO_RUN_DIR", {"LIT_FEDCO_RUN_DIR": "/tmp/another-run"}),
    case("sub-run-with-jobs", ["run_name=g", "sub_run=0", "jobs=2"], r"jobs: got 2, expected 1 with sub_run=0 \(a single sub-run runs in one process"),
    case("drop-positive-not-binary", ["data.drop_positive=0.5"], r"data\.drop_positive: got 0\.5, but data\.binary=false: it removes positives of binary data only"),
    case("clients-without-cohort", ["data.num_clients=5"], r"cohort: got 10, expected an int in \[1, 5\] \(K = 5; with another data\.num_clients, set cohort too\); set e\.g\. cohort=5$"),
    case("updater-and-updaters", ["updater=comfedl", "updaters=[fedavg]"], r"updaters: given twice \('updater=comfedl', then 'updaters=\[fedavg\]'\)"),
    case("dot-key", [".rounds=5"], r"command line: got '.rounds=5', whose key '.rounds' is not a config key"),
    case("double-dot-key", ["data..name=x"], r"command line: got 'data..name=x', whose key 'data..name' is not a config key"),
    case("preset-passwd", ["preset={d}/passwd"], r"preset: .*passwd is not a lit_fedco preset: 'root:x:0:0:root:/root:/bin/bash[^']*…' is not a config key"),
    # --- jobs and sub-runs (issue 20)
    case("jobs-0", ["jobs=0"], r"jobs: got 0, expected an int in \[1, \d+\]; set e\.g\. jobs=2"),
    case("jobs-with-devices", ["jobs=2", "devices=2"], r"jobs: got 2, expected 1 with devices or num_nodes > 1"),
    case("sub-run-out-of-range", ["updaters=[comfedl,fedavg]", "seeds=[0]", "sub_run=2", "run_name=g"], r"sub_run: got 2, expected an index in \[0, 1\] \(--list-sub-runs lists them\)"),
    case("sub-run-without-run-name", ["sub_run=0"], r"run_name: got '', expected the name of the run the sub-run belongs to"),
    case("sub-run-with-resume-path", ["sub_run=0", "run_name=g", "resume=x.ckpt"], r"resume: got 'x.ckpt', expected '' or auto with sub_run or jobs"),
    case("jobs-in-variant", ["variants=[jobs=2]"], r"variants\[0\]: sets jobs=2, a key of the whole run"),
    # --- a researcher's own data (issue 31)
    case("own-data-no-data-dir", ["data.name=npz"], r"data\.data_dir: empty, but data\.name=npz reads an \.npz file"),
    case("own-data-missing-dir", ["data.name=imagefolder", "data.data_dir={d}/nothing_here"], r"data\.data_dir: got '.*nothing_here', which does not exist; data\.name=imagefolder reads an ImageFolder tree"),
    case("data-module-missing", ["data.name=no_such_data_module:load"], r"data\.name: cannot import module 'no_such_data_module'"),
    case("data-function-missing", ["data.name=bad_data_fn:lod"], r"data\.name: module 'bad_data_fn' has no function 'lod' \(its functions: load, wrong_type\)"),
    case("data-function-wrong-type", ["data.name=bad_data_fn:wrong_type"], r"data\.name: 'bad_data_fn:wrong_type' returned a 2-item list, expected a lit_fedco\.data\.UserData"),
    case("data-function-labels", ["data.name=bad_data_fn:load", "data.classes=2"], r"data\.name: bad_data_fn:load's training labels include 2 \(row 2, 8 such rows\), expected class labels in \[0, 2\)"),
    case("own-data-clients-over-samples", ["data.name=npz", "data.data_dir={d}/small.npz", "data.partition=iid", "data.num_clients=50", "cohort=5"], r"data\.num_clients: got 50, expected at most the 30 samples"),
    case("shards-over-samples", ["data.name=npz", "data.data_dir={d}/small.npz", "data.partition=shards", "data.num_clients=10", "data.shards_per_client=4", "cohort=5"], r"data\.shards_per_client: got 4, expected num_clients \* shards_per_client <= the 30 samples"),
    case("natural-without-groups", ["data.partition=natural"], r"data\.partition: got 'natural' \(a client per group id\), but data\.name=digits gives no group ids"),
    case("natural-clients-mismatch", ["data.name=npz", "data.data_dir={d}/small.npz", "data.partition=natural", "cohort=3"], r"data\.num_clients: got 10, expected the 3 group ids of the training data .*set e\.g\. data\.num_clients=3"),
    case("own-without-test-groups", ["data.name=npz", "data.data_dir={d}/small.npz", "data.partition=natural", "data.num_clients=3", "data.val_mode=own", "cohort=3"], r"data\.val_mode: got 'own', but the test split of data\.name=npz has no group ids"),
    case("own-without-natural", ["data.val_mode=own"], r"data\.val_mode: got 'own', which needs data\.partition=natural"),
]  # fmt: skip


# ------------------------------------------------------------------------- bad data files
def _idx(folder: Path, split: str, n: int, hw=(28, 28), label=None, cut=None, gz=False) -> None:
    g = np.random.default_rng(0)
    labels = g.integers(0, 10, n).astype(np.uint8)
    if label is not None:
        labels[0] = label
    files = {
        "images-idx3-ubyte": struct.pack(">IIII", 2051, n, *hw)
        + g.integers(0, 256, (n, *hw), dtype=np.uint8).tobytes(),
        "labels-idx1-ubyte": struct.pack(">II", 2049, n) + labels.tobytes(),
    }
    folder.mkdir(parents=True, exist_ok=True)
    for stem, payload in files.items():
        payload = gzip.compress(payload) if gz else payload
        payload = payload[: len(payload) // 2] if cut == stem or (cut and gz) else payload
        (folder / f"{split}-{stem}{'.gz' if gz else ''}").write_bytes(payload)


def _cifar(folder: Path, c: int = 10, label=None, row=3072, as_list=False) -> None:
    g = np.random.default_rng(0)

    def batch(n: int) -> object:
        labels = [int(v) for v in g.integers(0, c, n)]
        labels[0] = labels[0] if label is None else label
        data = g.integers(0, 256, (n, row), dtype=np.uint8)
        return (
            [1, 2] if as_list else {"data": data, ("labels" if c == 10 else "fine_labels"): labels}
        )

    if c == 10:
        names = [*(f"data_batch_{i}" for i in range(1, 6)), "test_batch"]
        folder = folder / "cifar-10-batches-py"
    else:
        names, folder = ["train", "test"], folder / "cifar-100-python"
    folder.mkdir(parents=True)
    for name in names:
        (folder / name).write_bytes(pickle.dumps(batch(40 if c == 10 else 400)))


@pytest.fixture(scope="module")
def bad_data(tmp_path_factory) -> Path:
    """Folders of files that decode to nonsense, and bad presets."""
    d = tmp_path_factory.mktemp("bad_data")
    for name, kw in {
        "mnist_label12": {"label": 12},
        "mnist_trunc": {"cut": "images-idx3-ubyte"},
        "mnist_gz_trunc": {"gz": True, "cut": "any"},
        "mnist_16": {"hw": (16, 16)},
        "mnist_zero": {"n": 0},
    }.items():
        for split in ("train", "t10k"):
            _idx(d / name, split, **{"n": 300, **kw})  # type: ignore[arg-type]
    _idx(d / "mnist_mixed", "train", 300)
    _idx(d / "mnist_mixed", "t10k", 100, hw=(16, 16))
    for split in ("train", "t10k"):
        _idx(d / "mnist_swapped", split, 300)
        a, b = (
            d / "mnist_swapped" / f"{split}-{s}" for s in ("images-idx3-ubyte", "labels-idx1-ubyte")
        )
        a_bytes = a.read_bytes()
        a.write_bytes(b.read_bytes())
        b.write_bytes(a_bytes)
    (d / "empty").mkdir()
    (d / "afile").write_text("not a folder\n")
    _cifar(d / "cifar_label10", label=10)
    _cifar(d / "cifar_labelneg", label=-1)
    _cifar(d / "cifar_list", as_list=True)
    _cifar(d / "cifar_cols", row=1000)
    _cifar(d / "cifar100_label100", c=100, label=100)
    for part in ("images_background", "images_evaluation"):
        (d / "omniglot_empty" / "omniglot-py" / part).mkdir(parents=True)
    presets = {"bad": "rounds: [1\n", "unknown": "roundz: 3\n", "badtype": "rounds: abc\n",
               "null": "rounds: null\n", "badnest": "data: 3\n", "empty": ""}  # fmt: skip
    for name, text in presets.items():
        (d / f"{name}.yaml").write_text(text)
    (d / "passwd").write_text(
        "root:x:0:0:root:/root:/bin/bash\n" + "daemon:x:1:1::/:/bin/sh\n" * 40
    )
    (d / "recipe_file").mkdir()
    os.mkfifo(d / "fifo")  # resume= of it must not wait for a writer
    (d / "recipe_file" / "comfedl_dro").write_text("not a folder\n")
    (d / "loop").mkdir()
    (d / "loop" / "a").symlink_to(d / "loop" / "b")
    (d / "loop" / "b").symlink_to(d / "loop" / "a")
    g = np.random.default_rng(0)  # 30 rows of 3 groups, and a test split without group ids
    np.savez(d / "small.npz", x=g.normal(size=(30, 4)), y=np.arange(30) % 3,
             group=np.arange(30) % 3, x_test=g.normal(size=(9, 4)), y_test=np.arange(9) % 3)  # fmt: skip
    (d / "bad_data_fn.py").write_text(
        "from dataclasses import dataclass\n\nimport numpy as np\n\n\n"
        "@dataclass(frozen=True)\nclass P:\n    classes: int = 3\n\n\n"
        "def load(params: P):\n    y = np.arange(24) % 3\n"
        "    return np.zeros((24, 2)), y, np.zeros((6, 2)), y[:6], params.classes\n\n\n"
        "def wrong_type():\n    return [1, 2]\n"
    )
    return d


@pytest.fixture(autouse=True)
def clean_env(monkeypatch, tmp_path):
    """No W&B, proxy or MASTER_PORT settings from outside; decompressed IDX files in tmp_path."""
    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    # a data function's parameters become data.* keys for the process: for this test only
    monkeypatch.setattr(catalog, "NODE_PARAMS", dict(catalog.NODE_PARAMS))
    for key in ("WANDB_API_KEY", "WANDB_BASE_URL", "MASTER_PORT", "NODE_RANK", "MASTER_ADDR"):
        monkeypatch.delenv(key, raising=False)
    for key in ("http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(key, raising=False)
        monkeypatch.delenv(key.upper(), raising=False)


# ------------------------------------------------------------------------- in this process
@pytest.mark.parametrize(("recipe", "argv", "pattern", "env"), CASES)
def test_bad_input_exits_2_with_one_line_and_writes_nothing(
    recipe, argv, pattern, env, bad_data, tmp_path, capsys, monkeypatch
):
    busy = socket.socket()
    busy.bind(("", 0))
    busy.listen()  # held open: the port MASTER_PORT=BUSY names is in use
    for key, value in env.items():
        value = str(busy.getsockname()[1]) if value == "BUSY" else value
        monkeypatch.setenv(key, value)
    monkeypatch.syspath_prepend(str(bad_data))  # bad_data_fn: data functions of one's own
    out = tmp_path / "out"
    defaults = importlib.import_module(f"lit_fedco.recipes.{recipe}").DEFAULTS
    args = override([*BASE, f"out_dir={out}"], [a.replace("{d}", str(bad_data)) for a in argv])
    with busy, pytest.raises(SystemExit) as exc:
        main(recipe, defaults, args)
    assert exc.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines
    assert re.match(r"lit_fedco: " + pattern, lines[0]), lines[0]
    assert not out.exists()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU")
def test_more_devices_than_gpus(tmp_path, capsys):
    count = torch.cuda.device_count()
    argv = [*BASE, f"out_dir={tmp_path / 'out'}", "accelerator=cuda", f"devices={count + 1}"]
    with pytest.raises(SystemExit) as exc:
        main("comfedl_dro", importlib.import_module("lit_fedco.recipes.comfedl_dro").DEFAULTS, argv)
    lines = capsys.readouterr().err.splitlines()
    assert exc.value.code == 2 and len(lines) == 1
    assert re.match(
        rf"lit_fedco: devices: got {count + 1}, expected at most the {count} CUDA", lines[0]
    )


# ------------------------------------------------------------------------- real processes
def _recipe(out: Path, *argv: str, env: dict[str, str] | None = None, recipe="comfedl_dro"):
    full = {**os.environ, "WANDB_MODE": "disabled", "XDG_CACHE_HOME": str(out.parent / "cache")}
    for key in ("WANDB_API_KEY", "WANDB_BASE_URL", "http_proxy", "https_proxy", "HTTP_PROXY",
                "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):  # fmt: skip
        full.pop(key, None)
    full.update(env or {})
    full = {k: v for k, v in full.items() if v is not None}
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", f"lit_fedco.recipes.{recipe}",
         *override([*BASE, f"out_dir={out}"], argv)],
        capture_output=True, text=True, env=full, cwd=REPO, timeout=300,
    )  # fmt: skip
    return proc, time.monotonic() - start


REAL = [
    (["seeds=[0,1"], {}, r"seeds: got '\[0,1' \(from the command line\), which does not parse"),
    (["tracking=[wandb]"], {"WANDB_MODE": "online", **UNREACHABLE},
     r"WANDB_MODE: got 'online', but the W&B server .* cannot be reached within 3 s"),
    ([*MNIST, "data.data_dir={d}/mnist_label12"], {},
     r"data\.data_dir: got .*training labels include 12"),
    (["accelerator=gpu"] if not torch.cuda.is_available() else ["accelerator=cuda", "devices=64"],
     {}, r"(accelerator|devices): got "),
]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(
    ("argv", "env", "pattern"),
    REAL,
    ids=["malformed-list", "wandb-online-no-server", "idx-label-12", "no-such-gpu"],
)
def test_a_real_process_exits_2_with_one_line_and_no_traceback(
    argv, env, pattern, bad_data, tmp_path
):
    out = tmp_path / "out"
    proc, seconds = _recipe(out, *(a.replace("{d}", str(bad_data)) for a in argv), env=env)
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and re.match(r"lit_fedco: " + pattern, lines[0]), proc.stderr
    assert not out.exists()
    assert seconds < 60  # W&B: no wait of about 90 s for a server that is not there


@pytest.mark.slow
def test_wandb_online_by_credentials_alone_falls_back_to_offline_with_one_warning(tmp_path):
    out = tmp_path / "out"
    proc, _ = _recipe(out, "updater=fedavg", "rounds=1", "tracking=[wandb]",
                      env={"WANDB_MODE": None, **UNREACHABLE})  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("lit_fedco: ")]
    assert len(warnings) == 1 and "logging offline instead" in warnings[0], proc.stderr
    assert any(out.rglob("offline-run-*")), sorted(str(p) for p in out.rglob("*"))
