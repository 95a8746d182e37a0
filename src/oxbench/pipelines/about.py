"""What each built-in preset is, in one line with its paper (``oxbench methods``).

A plugin's preset says it with ``register_method(config, about="...")``; a preset with neither is
listed with its family's description (:func:`oxbench.pipelines.presets.preset_about`).
"""

from __future__ import annotations

_SV = "spatial verification of the top 100 (Philbin et al. 2007)"

ABOUT: dict[str, str] = {
    # bag of words (family bow)
    "rootsift-bow": "RootSIFT bag of words, tf-idf inverted file (Sivic & Zisserman 2003; "
    "Philbin et al. 2007; RootSIFT: Arandjelovic & Zisserman 2012)",
    "rootsift-bow-sv": f"RootSIFT BoW + {_SV}",
    "rootsift-bow-sv-compact": "RootSIFT BoW + spatial verification from compressed, "
    "memory-mapped posting lists: the same ranking at +1M scale (Philbin et al. 2007)",
    "rootsift-bow-sv-qe": "RootSIFT BoW + spatial verification + AQE from verified images "
    "(Chum et al. 2007)",
    "rootsift-bow-sv-dqe": "RootSIFT BoW + spatial verification + discriminative query "
    "expansion (Arandjelovic & Zisserman 2012)",
    "rootsift-bow-dba-sv-dqe": "RootSIFT BoW + database-side augmentation + spatial "
    "verification + DQE (Arandjelovic & Zisserman 2012)",
    "rootsift-bow-sa": "RootSIFT BoW with soft assignment on the database side "
    "(Philbin et al. 2008)",
    "rootsift-bow-sa-sv": "RootSIFT BoW, soft assignment + spatial verification "
    "(Philbin et al. 2008)",
    "rootsift-bow-sa-sv-qe": "RootSIFT BoW, soft assignment + spatial verification + AQE "
    "(Philbin et al. 2008)",
    "sift-bow-sv": f"SIFT (not RootSIFT) BoW + {_SV}",
    # Hamming embedding (family he)
    "rootsift-he": "RootSIFT Hamming embedding, 64-bit signatures (Jegou et al. 2008)",
    "rootsift-he-sv": "Hamming embedding + spatial verification (Jegou et al. 2008; "
    "Philbin et al. 2007)",
    "rootsift-he-sv-qe": "Hamming embedding + spatial verification + AQE from verified images "
    "(Jegou et al. 2008; Chum et al. 2007)",
    "rootsift-he-wgc": "Hamming embedding + weak geometric consistency (Jegou et al. 2008)",
    "rootsift-he-wgc-sv": "HE + WGC + spatial verification (Jegou et al. 2008)",
    "rootsift-he-wgc-sv-qe": "HE + WGC + spatial verification + AQE (Jegou et al. 2008; "
    "Chum et al. 2007)",
    # ASMK (family asmk)
    "rootsift-asmk": "RootSIFT aggregated selective match kernel (Tolias et al. 2013)",
    "rootsift-asmk-sv": "ASMK + spatial verification (Tolias et al. 2013)",
    "rootsift-asmk-sv+vlad-dfs": "hybrid: ASMK + SV, then diffusion over whitened VLAD started "
    "from the verified images (the ASMK* + SP -> GeM + DFS row of Radenovic et al. 2018)",
    "rootsift-asmk-sv+gem-r101-dfs": "hybrid: ASMK + SV, then diffusion over the published "
    "ResNet-101 GeM (a model file) from the verified images (Radenovic et al. 2018)",
    "rootsift-bow-sv+vlad-dfs": "hybrid: RootSIFT BoW + SV, then diffusion over whitened VLAD "
    "started from the verified images (after Radenovic et al. 2018)",
    "rootsift-vlad-w+sv": "hybrid: whitened VLAD short list verified with RootSIFT by descriptor "
    "matching (Jegou et al. 2010; Philbin et al. 2007)",
    "gem-r101+w+sv": "hybrid: ResNet-101 GeM + learned whitening, short list verified with "
    "RootSIFT, a model file given (GeM + SV, Radenovic et al. 2018)",
    # global descriptors (family global)
    "rootsift-vlad": "VLAD of RootSIFT, 64 words (Jegou et al. 2010)",
    "rootsift-vlad-w": "VLAD + PCA whitening from the training set (Jegou & Chum 2012)",
    "rootsift-vlad-w-aqe": "whitened VLAD + average query expansion (Chum et al. 2007)",
    "rootsift-vlad-w-alpha-qe": "whitened VLAD + alpha query expansion (Radenovic et al. 2018)",
    "gem-r101": "ResNet-101 GeM, the published retrieval-SfM-120k weights (give the model file; "
    "Radenovic et al. 2018)",
    "gem-r101+w": "ResNet-101 GeM + the model's learned whitening (Radenovic et al. 2018)",
    "gem-r101+w+alpha-qe": "ResNet-101 GeM + learned whitening + alpha-QE (Radenovic et al. 2018)",
    "gem-r50-imagenet": "ImageNet ResNet-50 trunk, GeM pooling, off the shelf "
    "(Radenovic et al. 2018)",
    "gem-r50-imagenet+w": "ImageNet ResNet-50 GeM + PCA whitening from the training set "
    "(Radenovic et al. 2018)",
    "gem-r50-imagenet+w+aqe": "ImageNet ResNet-50 GeM + whitening + average QE (Chum et al. 2007)",
    "gem-r50-imagenet+w+alpha-qe": "ImageNet ResNet-50 GeM + whitening + alpha-QE "
    "(Radenovic et al. 2018)",
    "mac-r50-imagenet": "ImageNet ResNet-50, MAC (max) pooling (Tolias et al. 2016)",
    "spoc-r50-imagenet": "ImageNet ResNet-50, SPoC (sum) pooling (Babenko & Lempitsky 2015)",
    "rmac-r50-imagenet": "ImageNet ResNet-50, R-MAC regional pooling (Tolias et al. 2016)",
    "rmac-r50-imagenet+w": "ImageNet ResNet-50 R-MAC + PCA whitening (Tolias et al. 2016)",
    "rmac-vgg16-imagenet+w": "ImageNet VGG16 R-MAC, 512-D, PCA whitening learned on the other "
    "city (Tolias et al. 2016)",
    "neural-codes-alexnet": "Neural codes: fc6 of ImageNet AlexNet, 4,096-D (Babenko et al. 2014)",
    "neural-codes-alexnet+pca": "Neural codes: AlexNet fc6, PCA to 256-D learned on the other "
    "city (Babenko et al. 2014)",
    "neural-codes-vgg16": "Neural codes from VGG16's fc6, 4,096-D (Babenko et al. 2014)",
    "neural-codes-vgg16+pca": "Neural codes: VGG16 fc6, PCA to 256-D learned on the other city "
    "(Babenko et al. 2014)",
    "gem-r18-synthetic": "ResNet-18 GeM trained by `oxbench train` on the synthetic training "
    "city (contrastive loss, hard negatives: Radenovic et al. 2018)",
    "gem-r18-synthetic+w": "the synthetic-trained ResNet-18 GeM + PCA whitening",
    "gem-r18-synthetic+lw": "the synthetic-trained ResNet-18 GeM + its learned whitening "
    "(Radenovic et al. 2018)",
    "gem-r18-synthetic+w+alpha-qe": "the synthetic-trained ResNet-18 GeM + whitening + "
    "alpha-QE (Radenovic et al. 2018)",
    "features": "your own global descriptor files, exact search",
    "features-aqe": "your descriptors + average query expansion (Chum et al. 2007)",
    "features-alpha-qe": "your descriptors + alpha query expansion (Radenovic et al. 2018)",
    "features-dba": "your descriptors + database-side augmentation "
    "(Arandjelovic & Zisserman 2012; alpha-DBA: Radenovic et al. 2018)",
    "features-diffusion": "your descriptors + diffusion on the k-NN graph (Iscen et al. 2017)",
    "features-ivfpq": "your descriptors in a FAISS IVF-PQ index (Jegou et al. 2011)",
}
