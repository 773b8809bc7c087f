"""Omniglot read from a local folder by torchvision's own ``Omniglot`` class.

Only reading lives here (the few-shot task data are built by :mod:`lit_fedco.data.build`):
``DIR/omniglot-py/images_{background,evaluation}/<alphabet>/<character>/*.png``, unzipped;
nothing is downloaded. Images are resized to 28×28 as in MAML's Omniglot experiments.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import Tensor
from torchvision.datasets import Omniglot

from lit_fedco.core.errors import ConfigError

OMNIGLOT_SPLIT = (1028, 172, 423)
"""Train / validation / test characters (Vinyals et al. 2016; Torchmeta's split sizes)."""


def omniglot_split(n: int) -> tuple[int, int, int]:
    """Train / validation / test character counts: 1028/172/423 for the full 1623, the same
    proportions for a partial copy."""
    full = sum(OMNIGLOT_SPLIT)
    if n == full:
        return OMNIGLOT_SPLIT
    n_tr, n_va = round(n * OMNIGLOT_SPLIT[0] / full), round(n * OMNIGLOT_SPLIT[1] / full)
    return n_tr, n_va, n - n_tr - n_va


def load_omniglot(data_dir: str | Path) -> tuple[Tensor, Tensor]:
    """All 1623 Omniglot characters (background then evaluation alphabets) as 28×28 images in
    [0, 1] (ink = 1), labelled by character, read by torchvision's ``Omniglot`` class from
    ``data_dir/omniglot-py/images_{background,evaluation}/<alphabet>/<character>/*.png``.

    Raises:
        ConfigError: the folders are not there; the message says where they belong.
    """
    if not str(data_dir):
        raise ConfigError(
            "data.data_dir: empty, expected the folder holding omniglot-py/ (the unzipped "
            "images_background and images_evaluation of the Omniglot distribution)"
        )
    root = Path(data_dir).expanduser()

    class _Local(Omniglot):
        """torchvision's class reading unzipped folders (it checks the zip files otherwise)."""

        def _check_integrity(self) -> bool:
            return (Path(self.root) / self._get_target_folder()).is_dir()

    images, labels, offset = [], [], 0
    for background in (True, False):
        folder = root / "omniglot-py" / ("images_background" if background else "images_evaluation")
        expected = f"the Omniglot folder {folder}/<alphabet>/<character>/*.png"
        try:
            ds = _Local(str(root), background=background, download=False)
            for i in range(len(ds)):
                img, c = ds[i]
                small = img.resize((28, 28), Image.Resampling.LANCZOS)
                images.append(1.0 - torch.tensor(np.asarray(small, dtype=np.float32)) / 255.0)
                labels.append(c + offset)
        except Exception as err:  # a missing folder, or files that are not images
            why = "" if isinstance(err, RuntimeError) else f" ({type(err).__name__}: {err})"
            raise ConfigError(
                f"data.data_dir: got {str(root)!r}, expected {expected}{why}; unzip "
                "images_background.zip and images_evaluation.zip there",
                key="data.data_dir",
            ) from None
        if not len(ds):
            raise ConfigError(
                f"data.data_dir: got {str(root)!r}, whose {folder} holds no images, expected "
                f"{expected}; unzip the Omniglot distribution there",
                key="data.data_dir",
            )
        offset += len(ds._characters)
    return torch.stack(images).unsqueeze(1), torch.tensor(labels, dtype=torch.int64)
